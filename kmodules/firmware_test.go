package kmodules

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/kmodules/kmodtest"
)

// writeFile writes content to root/name with its parents.
func writeFile(t *testing.T, root, name, content string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode)) // past the umask
}

func TestFirmwareDirs(t *testing.T) {
	root := t.TempDir()
	fw := filepath.Join(root, "lib/firmware")
	require.Equal(t, []string{fw + "/updates/6.1.0-x", fw + "/updates", fw + "/6.1.0-x", fw}, FirmwareDirs(root, "6.1.0-x"))
	require.Equal(t, []string{fw + "/updates", fw}, FirmwareDirs(root, "../x"), "no directory of a release that is none")
	writeFile(t, root, "sys/module/firmware_class/parameters/path", "/opt/nvidia/firmware\n", 0o644)
	require.Equal(t, []string{root + "/opt/nvidia/firmware", fw + "/updates/6.1.0-x", fw + "/updates", fw + "/6.1.0-x", fw}, FirmwareDirs(root, "6.1.0-x"))
	writeFile(t, root, "sys/module/firmware_class/parameters/path", "\n", 0o644) // unset: the kernel shows an empty line
	require.Len(t, FirmwareDirs(root, "6.1.0-x"), 4)
	require.Equal(t, "/lib/firmware", FirmwareDirs("", "6.1.0-x")[len(FirmwareDirs("", "6.1.0-x"))-1])
}

// TestFindFirmware: the kernel loader's order (plain in every directory,
// then .zst, then .xz; directories in order), links followed inside a
// directory and not out of it, what is not a regular file every user may
// read left out with the reason, and a required name missing refused with
// the package to install.
func TestFindFirmware(t *testing.T) {
	root := t.TempDir()
	dirs := FirmwareDirs(root, "6.1.0-x")
	fw, upd := dirs[3], dirs[0]
	writeFile(t, fw, "a/plain.bin", "plain", 0o644)
	writeFile(t, fw, "a/both.bin", "plain both", 0o644)
	writeFile(t, upd, "a/both.bin.xz", "xz both in updates", 0o644)
	writeFile(t, upd, "a/upd.bin", "updates", 0o644)
	writeFile(t, fw, "a/upd.bin", "base", 0o644)
	writeFile(t, fw, "a/only.bin.xz", "xz", 0o644)
	writeFile(t, dirs[2], "a/only.bin.zst", "zst", 0o644)
	require.NoError(t, os.Symlink("plain.bin", filepath.Join(fw, "a/link.bin")))
	writeFile(t, root, "secret", "secret", 0o644)
	require.NoError(t, os.Symlink("../../../secret", filepath.Join(fw, "a/esc.bin")))
	require.NoError(t, os.Symlink(filepath.Join(root, "secret"), filepath.Join(fw, "a/abs.bin")))
	require.NoError(t, os.MkdirAll(filepath.Join(fw, "a/dir.bin"), 0o755))
	writeFile(t, fw, "a/private.bin", "root's", 0o600)

	ref := func(n string) FirmwareRef { return FirmwareRef{Module: "m", Name: n, Version: "1.2.3"} }
	var refs []FirmwareRef
	for _, n := range []string{"a/plain.bin", "a/both.bin", "a/upd.bin", "a/only.bin", "a/link.bin", "a/esc.bin", "a/abs.bin", "a/dir.bin", "a/private.bin", "a/none.bin", "a/plain.bin/x"} {
		refs = append(refs, ref(n))
	}
	files, err := FindFirmware(dirs, refs, nil)
	require.NoError(t, err, "nothing required")
	got := map[string]string{}
	for _, f := range files.Found {
		got[f.Name] = strings.TrimPrefix(filepath.Join(f.Dir, f.Path), root+"/lib/firmware")
		file, err := OpenFirmware(f)
		require.NoError(t, err)
		b, err := io.ReadAll(file)
		file.Close()
		require.NoError(t, err)
		require.Equal(t, f.Size, int64(len(b)), f.Name)
		require.Equal(t, "m", f.Module)
	}
	require.Equal(t, map[string]string{
		"a/plain.bin": "/a/plain.bin",
		"a/both.bin":  "/a/both.bin", // the plain file before any .xz, wherever it lies
		"a/upd.bin":   "/updates/6.1.0-x/a/upd.bin",
		"a/only.bin":  "/6.1.0-x/a/only.bin.zst", // .zst before .xz
		"a/link.bin":  "/a/link.bin",
	}, got)
	why := map[string]string{}
	for _, m := range files.Missing {
		why[m.Name] = m.Why
	}
	require.Len(t, why, 6)
	require.Contains(t, why["a/esc.bin"], "path escapes from parent")
	require.Contains(t, why["a/abs.bin"], "path escapes from parent", "an absolute link leads out of the directory")
	require.Contains(t, why["a/dir.bin"], "not a regular file")
	require.Contains(t, why["a/private.bin"], "not readable by every user")
	require.Equal(t, "not found", why["a/none.bin"])
	require.Equal(t, "not found", why["a/plain.bin/x"])

	// Required: the missing GSP file is an error naming module, file and package.
	gsp := FirmwareRef{Module: "nvidia", Name: "nvidia/580.159.04/gsp_ga10x.bin", Version: "580.159.04"}
	files, err = FindFirmware(dirs, []FirmwareRef{ref("a/none.bin"), gsp}, []string{"nvidia/*/gsp_*.bin"})
	var me *MissingFirmwareError
	require.ErrorAs(t, err, &me)
	require.Equal(t, gsp, me.FirmwareRef)
	require.Len(t, files.Missing, 2)
	msg := err.Error()
	require.NotContains(t, msg, "\n")
	for _, want := range []string{"module nvidia", "nvidia/580.159.04/gsp_ga10x.bin", fw, "install the driver's firmware package (e.g. nvidia-firmware-580.159.04)"} {
		require.Contains(t, msg, want)
	}
	writeFile(t, upd, "nvidia/580.159.04/gsp_ga10x.bin", "gsp", 0o644)
	files, err = FindFirmware(dirs, []FirmwareRef{gsp}, []string{"nvidia/*/gsp_*.bin"})
	require.NoError(t, err)
	require.Equal(t, "nvidia/580.159.04/gsp_ga10x.bin", files.Found[0].Path)

	// A name no module could give is refused before any lookup.
	_, err = FindFirmware(dirs, []FirmwareRef{ref("../../secret")}, nil)
	var fe *FirmwareNameError
	require.ErrorAs(t, err, &fe)
	// No directory at all: everything is missing.
	files, err = FindFirmware([]string{filepath.Join(root, "none")}, []FirmwareRef{ref("a/plain.bin")}, nil)
	require.NoError(t, err)
	require.Len(t, files.Missing, 1)
}

// TestResolveFirmware: Resolve reads each module's firmware names from
// its .modinfo; Set.Firmware lists them in load order, each once, with the
// first module naming it; a fixture module that is no ELF object names
// none and says why; a module naming a path out of /lib/firmware is
// refused, naming the module.
func TestResolveFirmware(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(fixture(t))))
	dir := filepath.Join(root, fixtureRelease)
	writeFile(t, dir, "kernel/net/core/failover.ko", string(kmodtest.Object("firmware=test/shared.bin", "version=2")), 0o644)
	writeFile(t, dir, "kernel/drivers/net/virtio_net.ko", string(kmodtest.Object("firmware=test/net.bin", "firmware=test/shared.bin", "version=9")), 0o644)
	set, err := Resolve(Config{Release: fixtureRelease, HostDir: root, Modules: []string{"virtio_net"}})
	require.NoError(t, err)
	require.Equal(t, []FirmwareRef{{Module: "failover", Name: "test/shared.bin", Version: "2"}, {Module: "virtio_net", Name: "test/net.bin", Version: "9"}}, set.Firmware())
	for _, m := range set.Modules {
		switch m.Name {
		case "failover", "virtio_net":
			require.NoError(t, m.ModinfoErr)
		default:
			require.ErrorContains(t, m.ModinfoErr, "not an ELF object", m.Name)
			require.Empty(t, m.Firmware)
		}
	}
	writeFile(t, dir, "kernel/drivers/net/net_failover.ko", string(kmodtest.Object("firmware=/etc/shadow")), 0o644)
	_, err = Resolve(Config{Release: fixtureRelease, HostDir: root, Modules: []string{"virtio_net"}})
	var fe *FirmwareNameError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "net_failover", fe.Module)
	require.Contains(t, err.Error(), `module net_failover names firmware "/etc/shadow", which is an absolute path`)
}
