package jobrun

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun/jobruntest"
)

// moduleJob is the initramfs config of a job with --module user on the
// kmodules fixture's kernel (6.1.0-test), whose tree has no power-button
// modules and no 9P client.
func moduleJob(t *testing.T, hostModules string, user ...string) initramfs.Config {
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	im, err := rootfs.Open(img)
	require.NoError(t, err)
	t.Cleanup(func() { im.Close() })
	return initramfs.Config{Image: im, Agent: jobruntest.Agent(t, ProbeAnswer()), Release: "6.1.0-test", HostModules: hostModules,
		Modules: jobModules(false, user), CacheDir: t.TempDir()}
}

func fixtureModuleTree(t *testing.T) string {
	p, err := filepath.Abs("../../kmodules/testdata/lib/modules")
	require.NoError(t, err)
	return p
}

// TestModuleFlag: --module's modules are loaded after the defaults with
// their dependencies (uas needs usb-storage); a name the kernel lacks is
// the user's error, naming the module and the release; a kernel without
// any module tree cannot load one.
func TestModuleFlag(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	res, err := buildJobInitrd(moduleJob(t, fixtureModuleTree(t), "uas"), []string{"uas"}, nil, log)
	require.NoError(t, err)
	require.Equal(t, []string{"usb_storage", "uas"}, res.Modules[len(res.Modules)-2:])
	require.Contains(t, res.Modules, "virtio_net", "the defaults stay")
	require.NoError(t, checkModuleSource(res, []string{"uas"}, "6.1.0-test"))

	_, err = buildJobInitrd(moduleJob(t, fixtureModuleTree(t), "uas", "rdma_rxe"), []string{"uas", "rdma_rxe"}, nil, log)
	var me *moduleError
	require.ErrorAs(t, err, &me)
	msg := err.Error()
	require.NotContains(t, msg, "\n")
	assert.True(t, strings.HasPrefix(msg, "--module rdma_rxe: kernel 6.1.0-test has no module rdma_rxe (neither in "), msg)
	assert.Contains(t, msg, "boot a kernel that has it (--kernel)")

	// The defaults' fallbacks still apply: a missing default module is not
	// the user's error.
	_, err = buildJobInitrd(moduleJob(t, fixtureModuleTree(t), "nosuch"), nil, nil, log)
	require.False(t, errors.As(err, &me), "nosuch is not the user's here: %v", err)
	var unknown *kmodules.UnknownModuleError
	require.ErrorAs(t, err, &unknown)

	res, err = buildJobInitrd(moduleJob(t, t.TempDir(), "uas"), []string{"uas"}, nil, log)
	require.NoError(t, err, "no module tree: the build itself succeeds")
	require.Empty(t, res.ModuleSource)
	require.ErrorContains(t, checkModuleSource(res, []string{"uas"}, "6.1.0-test"), "--module uas: kernel 6.1.0-test has no modules directory")
	require.NoError(t, checkModuleSource(res, nil, "6.1.0-test"))
}

// TestGPUModules: a job passing an NVIDIA GPU loads gpudriver's module set
// from the host's tree (nvidia and nvidia_uvm from updates/dkms,
// nvidia_modeset where present, never nouveau); a kernel without nvidia
// is refused before boot as the host's fault (3), or IMAGE's (2) when the
// modules come from IMAGE; a kernel without any module tree is the host's
// fault too.
func TestGPUModules(t *testing.T) {
	const h100 = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gpuTree, err := filepath.Abs("../../gpudriver/testdata/host/usr/lib/modules")
	require.NoError(t, err)
	// The GPU tree has no virtio modules (its kernel would have them
	// built in): only the device's modules are asked for.
	gpuJob := func(tree, release string) initramfs.Config {
		cfg := moduleJob(t, tree)
		dev := gpudriver.ForModaliases([]string{h100})
		cfg.Release, cfg.Modaliases = release, []string{h100}
		cfg.Modules = dev.Load
		cfg.Optional, cfg.Exclude = dev.Optional, dev.Exclude
		return cfg
	}
	cfg := gpuJob(gpuTree, "6.18.44-fc-v657-gpu")
	res, err := buildJobInitrd(cfg, nil, nil, log)
	require.NoError(t, err)
	require.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_modeset"}, res.Modules, "no nouveau")
	require.NoError(t, checkDeviceModuleSource(res, cfg))

	cfg = gpuJob(fixtureModuleTree(t), "6.1.0-test")
	_, err = buildJobInitrd(cfg, nil, nil, log)
	var de *deviceModuleError
	require.ErrorAs(t, err, &de)
	msg := err.Error()
	require.NotContains(t, msg, "\n")
	assert.True(t, strings.HasPrefix(msg, "--gpu/--vf: the passed-through device needs module nvidia, which kernel 6.1.0-test lacks"), msg)
	assert.Contains(t, msg, "DKMS")
	assert.Equal(t, Host, de.kind())

	img := &deviceModuleError{&kmodules.UnknownModuleError{Name: "nvidia", Release: "6.1.0-test", Where: "image:/lib/modules/6.1.0-test"}}
	assert.Equal(t, Input, img.kind())
	assert.Contains(t, img.Error(), "IMAGE's /lib/modules/6.1.0-test")

	cfg = gpuJob(t.TempDir(), "6.1.0-test")
	res, err = buildJobInitrd(cfg, nil, nil, log)
	require.NoError(t, err, "no module tree: the build itself succeeds")
	err = checkDeviceModuleSource(res, cfg)
	require.ErrorContains(t, err, "needs module nvidia, but kernel 6.1.0-test has no modules directory")
	assert.Equal(t, Host, classify(err, Input).Kind)

	cfg.Modaliases = nil
	require.NoError(t, checkDeviceModuleSource(res, cfg), "no GPU, no need")
}

// TestFirmwareErrorIsTheHosts: a required firmware file the host lacks
// (an NVIDIA GPU's GSP firmware), however deep the build wrapped it, is
// the host's fault with the --gpu flag and the firmware named; any other
// error is not one.
func TestFirmwareErrorIsTheHosts(t *testing.T) {
	mf := &kmodules.MissingFirmwareError{MissingFirmware: kmodules.MissingFirmware{
		FirmwareRef: kmodules.FirmwareRef{Module: "nvidia", Name: "nvidia/580.159.04/gsp_ga10x.bin", Version: "580.159.04"}, Why: "not found"},
		Dirs: []string{"/lib/firmware"}}
	e := firmwareError(fmt.Errorf("initramfs: %w", mf))
	require.NotNil(t, e)
	assert.Equal(t, Host, e.Kind)
	assert.Contains(t, e.Error(), "--gpu: ")
	assert.Contains(t, e.Error(), "gsp_ga10x.bin")
	assert.Nil(t, firmwareError(errors.New("other")))
}
