package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun/jobruntest"
)

// failingWriter fails every write: a report or list that cannot be written.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// noKVMTree is a host with CPUs and memory but no /dev/kvm: it cannot run
// any VM.
func noKVMTree(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 8<<30)
	tr.CPUInfo(46)
	tr.Interrupts(true)
	return tr
}

// kvmHostFlags put hpcvmm run on a host tree with hardware KVM
// (kvm_intel), 4 CPUs and 8 GiB on one node, and guest RAM on 4 KiB pages:
// the host checks pass on it whatever this machine has, so a test reaches
// what comes after them (a job's image checks). Later flags override them.
func kvmHostFlags(t *testing.T) []string {
	tr := noKVMTree(t)
	tr.KVM()
	tr.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	return []string{"--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--hugepages", "none", "--memory", "512M"}
}

// onKVMHost is args (a run command) on kvmHostFlags' host.
func onKVMHost(t *testing.T, args []string) []string {
	return append(append([]string{args[0]}, kvmHostFlags(t)...), args[1:]...)
}

// TestExitStatusEveryClass runs each status of exitTable for each command
// that gives it, on paths a host without KVM reaches: the status says who
// failed. (A booted guest's 0, a job's own status and a run's hard stop
// need a guest that boots: tests/boot_test.go and tests/jobs_test.go.)
func TestExitStatusEveryClass(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	kernel := synthKernel(t)
	noKVM := noKVMTree(t)
	hostFlags := func(tr *hosttest.Tree) []string { return []string{"--sysfs", tr.Sys(), "--procfs", tr.Proc()} }
	// A host tree with hardware KVM whose /dev/kvm is a plain file: every
	// check passes and opening KVM fails, the VM's own failure.
	brokenKVM := noKVMTree(t)
	brokenKVM.KVM()
	brokenKVM.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/data"), []byte("x"), 0o644))
	vm := func(tr *hosttest.Tree, extra ...string) []string {
		return append(append([]string{"run", "--kernel", kernel, "--memory", "256M", "--hugepages", "none", "--console", "none"}, hostFlags(tr)...), extra...)
	}
	job := func(tr *hosttest.Tree, extra ...string) []string {
		a := append(append([]string{"run", "--kernel", kernel, "--memory", "256M", "--hugepages", "none", "--contain"}, hostFlags(tr)...), "--rootfs", img)
		return append(a, extra...)
	}

	// The other commands' hosts: a device on vfio-pci (bind succeeds), one
	// the host uses (bind refuses it), one missing from sysfs (the rebind
	// fails).
	ready := readyTree(t)
	ready.Write("sys/bus/pci/devices/0000:00:04.0/driver_override", "vfio-pci\n")
	const nic = "0000:00:03.0"
	ready.AddDevice(hosttest.Device{BDF: nic, Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3})
	ready.ClassNet(nic, "virtio2/net", "eth0", 0x1003)
	ready.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
	bind := func(args ...string) []string {
		return append(append([]string{"bind", "--state-dir", filepath.Join(t.TempDir(), "state"), "--devfs", ready.Dev()}, hostFlags(ready)...), args...)
	}
	looseState := t.TempDir()
	require.NoError(t, os.Chmod(looseState, 0o777))
	badJournal := t.TempDir()
	// A journal of a process that no longer runs, with a change this
	// hpcvmm cannot undo.
	require.NoError(t, os.WriteFile(filepath.Join(badJournal, "4194303-00.json"),
		[]byte(`{"pid":4194303,"changes":[{"kind":"from-a-newer-hpcvmm","bdf":"0000:00:04.0"}]}`), 0o600))

	for _, tc := range []struct {
		cmd  string // the exitTable column
		code int
		args []string
		out  func(*bytes.Buffer) // nil: a buffer; else stdout is a failing writer
		want string              // in stderr (or stdout for a success)
	}{
		{"run", exitFailed, vm(brokenKVM), nil, "hpcvmm run:"},
		{"run", exitInput, vm(noKVM, "--memory", "lots"), nil, "--memory"},
		{"run", exitHost, vm(noKVM), nil, "the host cannot run this VM"},
		{"job", exitInput, job(noKVM, "--user", "alice", "--", "sh"), nil, "--user alice"},
		{"job", jobproto.CodeNotFound, job(brokenKVM, "--", "nosuch"), nil, "not found"},
		{"job", jobproto.CodeNotExecutable, job(brokenKVM, "--", "/bin/data"), nil, "not executable"},
		{"check", exitOK, append([]string{"check", "--gpu", "00:04.0"}, hostFlags(readyTree(t))...), nil, "0 failed"},
		{"check", exitFailed, append([]string{"check", "--gpu", "00:04.0"}, hostFlags(readyTree(t))...), func(*bytes.Buffer) {}, "write report"},
		{"check", exitInput, append([]string{"check", "--gpu", "zz"}, hostFlags(noKVM)...), nil, `--gpu: PCI address "zz"`},
		{"check", exitHost, append([]string{"check", "--memory", "256M", "--hugepages", "none"}, hostFlags(noKVM)...), nil, ""},
		{"devices", exitOK, append([]string{"devices"}, hostFlags(readyTree(t))...), nil, "0000:00:04.0"},
		{"devices", exitFailed, append([]string{"devices", "--json"}, hostFlags(readyTree(t))...), func(*bytes.Buffer) {}, "disk full"},
		{"devices", exitInput, []string{"devices", "extra"}, nil, "unexpected argument"},
		{"devices", exitHost, []string{"devices", "--sysfs", filepath.Join(t.TempDir(), "absent")}, nil, "hpcvmm devices:"},
		{"bind", exitOK, bind("0000:00:04.0"), nil, ""},
		{"bind", exitFailed, bind("0000:00:09.0"), nil, "hpcvmm bind:"},
		{"bind", exitInput, bind("0000:zz:00.0"), nil, `"0000:zz:00.0"`},
		{"bind", exitHost, bind(nic), nil, "the host uses it"},
		{"unbind", exitOK, []string{"unbind", "--state-dir", t.TempDir()}, nil, "nothing to restore"},
		{"unbind", exitFailed, []string{"unbind", "--state-dir", badJournal}, nil, "hpcvmm unbind:"},
		{"unbind", exitInput, []string{"unbind", "not-a-bdf"}, nil, `"not-a-bdf"`},
		{"unbind", exitHost, []string{"unbind", "--state-dir", looseState}, nil, "chmod go-w"},
		{"version", exitOK, []string{"version"}, nil, "hpcvmm "},
		{"version", exitInput, []string{"version", "--bogus"}, nil, "unknown flag"},
	} {
		var out, errb bytes.Buffer
		var stdout interface{ Write([]byte) (int, error) } = &out
		if tc.out != nil {
			stdout = failingWriter{}
		}
		rc := dispatch(tc.args, strings.NewReader(""), stdout, &errb)
		assert.Equal(t, tc.code, rc, "%s %q: stdout %s stderr %s", tc.cmd, tc.args, out.String(), errb.String())
		assert.Contains(t, out.String()+errb.String(), tc.want, "%s %q", tc.cmd, tc.args)
		// The status is one the command's --help lists.
		col := tc.cmd
		if col == "job" {
			col = "run"
		}
		_, help, _ := hpcvmm(col, "--help")
		assert.Regexp(t, fmt.Sprintf(`(?m)^  (%d|\d+, %d|%d, \d+) `, tc.code, tc.code, tc.code), help[strings.Index(help, "\nExit status"):], "%s --help lists %d", col, tc.code)
	}
}

// TestExitHelpIsOneTable: every command's table is exitTable's rows that
// command gives, in order, and hpcvmm --help has them all.
func TestExitHelpIsOneTable(t *testing.T) {
	_, top, _ := hpcvmm("--help")
	for _, r := range exitTable {
		assert.Contains(t, top, "\n  "+r.code+" ", "hpcvmm --help lists %s", r.code)
	}
	for _, cmd := range []string{"run", "check", "devices", "bind", "unbind", "version"} {
		_, help, _ := hpcvmm(cmd, "--help")
		assert.True(t, strings.HasSuffix(help, exitHelp(cmd)+"\n"), "%s --help ends with its exit statuses", cmd)
		for _, r := range exitTable {
			_, gives := r.per[cmd]
			assert.Equal(t, gives, strings.Contains(help, "\n  "+r.code+" "), "%s --help and exit status %s", cmd, r.code)
		}
	}
}

// TestJobOnRefusedHostReadsNoImage: a job on a host that cannot run it
// (no /dev/kvm; kvm_pvm, which boots no stock kernel) is refused with
// exit 3 before IMAGE is read: a 300 MiB image leaves nothing in the
// initramfs cache, and the refusal takes milliseconds, not the seconds of a
// build (issue 35).
func TestJobOnRefusedHostReadsNoImage(t *testing.T) {
	useStaticAgent(t)
	kernel := synthKernelRelease(t, "6.1.0-test")
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	big, err := os.Create(filepath.Join(img, "data"))
	require.NoError(t, err)
	require.NoError(t, big.Truncate(300<<20)) // sparse: 300 MiB to read, none on disk
	require.NoError(t, big.Close())
	pvm := noKVMTree(t)
	pvm.KVM()
	pvm.Write("sys/module/kvm_pvm/parameters/placeholder", "\n")
	for name, tr := range map[string]*hosttest.Tree{"no /dev/kvm": noKVMTree(t), "kvm_pvm": pvm} {
		cache := filepath.Join(t.TempDir(), "cache")
		start := time.Now()
		rc, out, errs := hpcvmm("run", "--kernel", kernel, "--memory", "1G", "--hugepages", "none", "--contain",
			"--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--initramfs-cache", filepath.Join(cache, "initramfs"),
			"--kernel-cache", filepath.Join(cache, "kernels"), "--rootfs", img, "--", "sh")
		took := time.Since(start)
		assert.Equal(t, exitHost, rc, "%s: %s", name, errs)
		assert.Empty(t, out)
		assert.Contains(t, errs, "hpcvmm run: the host cannot run this VM", name)
		assert.NoDirExists(t, cache, "%s: nothing cached for a refused host", name)
		// Reading the image alone takes longer than this (300 MiB hashed
		// for its key); the refusal reads a few sysfs files.
		assert.Less(t, took, time.Second, name)
		t.Logf("%s: refused in %v", name, took)
	}
}

// useStaticAgent makes jobruntest's stand-in the job's agent for this
// test: the test binary itself may be dynamically linked.
func useStaticAgent(t *testing.T) string {
	old := jobAgent
	jobAgent = jobruntest.Agent(t, jobrun.ProbeAnswer())
	t.Cleanup(func() { jobAgent = old })
	return jobAgent
}

// synthKernelRelease is synthKernel with a version string naming release,
// so a job finds which modules to take.
func synthKernelRelease(t *testing.T, release string) string {
	p := synthKernel(t)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	const at = 0x400 // in the setup sectors, past the header
	binary.LittleEndian.PutUint16(b[0x20e:], at-0x200)
	copy(b[at:], release+" (test@hpcvmm) #1 SMP\x00")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

// TestJobMemoryMinimumIsTheOneThatWorks: the guest memory a job's first
// refusal asks for counts what the initramfs adds to IMAGE (the agent,
// here 40 MiB as hpcvmm's binary is near, and the modules), so a second
// launch with exactly that --memory builds the initramfs instead of
// asking for more (issue 35: 133 MiB, then 155 MiB).
func TestJobMemoryMinimumIsTheOneThatWorks(t *testing.T) {
	agent := useStaticAgent(t)
	require.NoError(t, os.Truncate(agent, 40<<20))
	kernel := synthKernelRelease(t, "6.1.0-test")
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	cache := filepath.Join(t.TempDir(), "initramfs")
	job := func(memory string) (int, string) {
		rc, _, errs := hpcvmm(onKVMHost(t, []string{"run", "--kernel", kernel, "--kernel-cache", filepath.Join(t.TempDir(), "k"),
			"--initramfs-cache", cache, "--contain", "--memory", memory, "--rootfs", img, "--", "sh"})...)
		return rc, errs
	}
	rc, errs := job("64M")
	require.Equal(t, exitInput, rc, errs)
	m := regexp.MustCompile(`needs at least (\d+) MiB`).FindStringSubmatch(errs)
	require.NotNil(t, m, errs)
	rc, errs = job(m[1] + "M")
	assert.NotContains(t, errs, "raise --memory", "the first minimum (%s MiB) is enough", m[1])
	entries, _ := os.ReadDir(cache)
	assert.NotEmpty(t, entries, "the initramfs was built (exit %d): %s", rc, errs)
}
