package kmodules

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/stretchr/testify/require"
)

const fixtureRelease = "6.1.0-test"

// Real modalias strings: QEMU's NVMe (1b36:0010), its edu device (no
// driver), a virtio-net (1af4:1041) and a USB disk.
const (
	nvmeAlias   = "pci:v00001B36d00000010sv00001AF4sd00001100bc01sc08i02"
	eduAlias    = "pci:v00001234d000011E8sv00001AF4sd00001100bc00scFFi00"
	virtioAlias = "pci:v00001AF4d00001041sv00001AF4sd00001100bc02sc00i00"
	usbAlias    = "usb:v13FDp3940d0150dc00dsc00dp00ic08isc06ip50in00"
)

func fixture(t *testing.T) string {
	dir, err := filepath.Abs("testdata/lib/modules")
	require.NoError(t, err)
	return dir
}

func TestResolveFixtureDefaults(t *testing.T) {
	set, err := Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modaliases: []string{nvmeAlias, eduAlias, "virtio:d00000004v00001AF4"}})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(fixture(t), fixtureRelease), set.Source)
	require.Equal(t, []string{
		"virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci",
		"virtio_console",
		"failover", "net_failover", "virtio_net",
		"nvme_core", "nvme",
	}, set.Names())
	require.Equal(t, []string{eduAlias}, set.Unmatched, "edu has no driver")
	require.Equal(t, []string{"virtio_rng"}, set.Builtin, "a built-in driver's alias claims the rng")
	for _, m := range set.Modules {
		require.True(t, bytes.HasPrefix(m.Data, []byte("\x7fELF fixture module "+strings.TrimSuffix(filepath.Base(m.Path), ".ko"))), "%s decompressed: %q", m.Path, m.Data)
		require.True(t, strings.HasSuffix(m.Path, ".ko"), m.Path)
	}
	require.Equal(t, "kernel/drivers/char/virtio_console.ko", set.Modules[5].Path)
}

func TestResolveDependenciesFirstNoDuplicates(t *testing.T) {
	set, err := Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modules: []string{"uas", "usb-storage", "net_failover", "virtio_net"}, Modaliases: []string{usbAlias}})
	require.NoError(t, err)
	require.Equal(t, []string{"usb_storage", "uas", "failover", "net_failover", "virtio", "virtio_ring", "virtio_net"}, set.Names())
}

func TestResolveBuiltinAndMissing(t *testing.T) {
	set, err := Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modules: []string{"virtio_blk", "virtio-rng"}})
	require.NoError(t, err)
	require.Empty(t, set.Modules)
	require.Equal(t, []string{"virtio_blk", "virtio_rng"}, set.Builtin)

	_, err = Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modules: []string{"nonexistent"}})
	require.ErrorContains(t, err, "module nonexistent is neither in")
	var unknown *UnknownModuleError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, UnknownModuleError{Name: "nonexistent", Release: fixtureRelease, Where: filepath.Join(fixture(t), fixtureRelease)}, *unknown)

	set, err = Resolve(Config{Release: "9.9.9-none", HostDir: fixture(t), Modaliases: []string{nvmeAlias}})
	require.NoError(t, err)
	require.Empty(t, set.Source)
	require.Equal(t, []string{nvmeAlias}, set.Unmatched)

	_, err = Resolve(Config{Release: "../etc", HostDir: fixture(t)})
	require.ErrorContains(t, err, "which no release has")
}

// TestResolveOptionalAndExclude: an optional module loads with its
// dependencies where the tree has it and is reported absent where not; an
// excluded module is never brought by a modalias, whose device still counts
// as matched.
func TestResolveOptionalAndExclude(t *testing.T) {
	set, err := Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modules: []string{"virtio_pci"},
		Optional: []string{"nvidia-modeset", "uas", "virtio_blk"}, Modaliases: []string{nvmeAlias, usbAlias}, Exclude: []string{"usb-storage", "nvme"}})
	require.NoError(t, err)
	require.Equal(t, []string{"virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci", "usb_storage", "uas"}, set.Names(),
		"uas (optional) brings usb_storage as its dependency; nvme is excluded")
	require.Equal(t, []string{"nvidia_modeset"}, set.Absent)
	require.Equal(t, []string{"virtio_blk"}, set.Builtin)
	require.Empty(t, set.Unmatched, "excluded modules still match their devices")

	set, err = Resolve(Config{Release: fixtureRelease, HostDir: fixture(t), Modules: []string{}, Modaliases: []string{nvmeAlias}})
	require.NoError(t, err)
	require.Equal(t, []string{"nvme_core", "nvme"}, set.Names(), "without Exclude the alias brings nvme")

	set, err = Resolve(Config{Release: "9.9.9-none", HostDir: fixture(t), Optional: []string{"uas"}})
	require.NoError(t, err)
	require.Equal(t, []string{"uas"}, set.Absent, "no modules directory: every optional module is absent")
}

// TestValidateRelease: a release is one plain directory name under
// /lib/modules; HostState never looks outside it either.
func TestValidateRelease(t *testing.T) {
	for _, ok := range []string{fixtureRelease, "6.1.0-18-amd64", "5.14.0-362.8.1.el9_3.x86_64", "6.8.0+"} {
		require.NoError(t, ValidateRelease(ok), ok)
	}
	for _, bad := range []string{"", ".", "..", "../../tmp", "a/b", "6.1\x1b]52;c;", "6.1\n", "6.1 x", strings.Repeat("9", MaxRelease+1)} {
		require.Error(t, ValidateRelease(bad), "%q", bad)
	}
	// A directory outside hostDir that has a modules.dep is not read.
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "modules.dep"), nil, 0o644))
	host := t.TempDir()
	rel, err := filepath.Rel(host, outside)
	require.NoError(t, err)
	require.Equal(t, "none", HostState(host, rel))
}

func TestResolveFromImageFirst(t *testing.T) {
	// A merged-/usr rootfs: /lib → usr/lib, the modules under
	// usr/lib/modules. The host directory is empty: only the image's count.
	root := t.TempDir()
	require.NoError(t, os.Symlink("usr/lib", filepath.Join(root, "lib")))
	dst := filepath.Join(root, "usr/lib/modules", fixtureRelease)
	require.NoError(t, os.CopyFS(dst, os.DirFS(filepath.Join(fixture(t), fixtureRelease))))
	im, err := rootfs.Open(root)
	require.NoError(t, err)
	set, err := Resolve(Config{Release: fixtureRelease, Image: im, HostDir: t.TempDir(), Modaliases: []string{nvmeAlias}})
	require.NoError(t, err)
	require.Equal(t, "image:/lib/modules/"+fixtureRelease, set.Source)
	require.Equal(t, []string{"nvme_core", "nvme"}, set.Names()[len(set.Names())-2:])

	// A module modules.dep lists but the image lacks.
	require.NoError(t, os.Remove(filepath.Join(dst, "kernel/drivers/nvme/host/nvme.ko")))
	_, err = Resolve(Config{Release: fixtureRelease, Image: im, HostDir: t.TempDir(), Modaliases: []string{nvmeAlias}})
	require.ErrorContains(t, err, "missing from the image")
}

func TestCorruptModule(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(fixture(t))))
	p := filepath.Join(dir, fixtureRelease, "kernel/drivers/virtio/virtio.ko.xz")
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xff
	require.NoError(t, os.Chmod(p, 0o644))
	require.NoError(t, os.WriteFile(p, b, 0o644))
	_, err = Resolve(Config{Release: fixtureRelease, HostDir: dir})
	require.ErrorContains(t, err, "virtio.ko.xz")
	require.ErrorContains(t, err, "corrupt")
}

func TestPCIModalias(t *testing.T) {
	sys := t.TempDir()
	dev := filepath.Join(sys, "bus/pci/devices/0000:03:00.0")
	require.NoError(t, os.MkdirAll(dev, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dev, "modalias"), []byte(nvmeAlias+"\n"), 0o444))
	got, err := PCIModalias(sys, "0000:03:00.0")
	require.NoError(t, err)
	require.Equal(t, nvmeAlias, got)
	_, err = PCIModalias(sys, "../../x")
	require.Error(t, err)
	_, err = PCIModalias(sys, "0000:04:00.0")
	require.ErrorContains(t, err, "0000:04:00.0")
}

// debianRelease is the Debian kernel whose modules this machine has
// (linux-image-amd64); tests against it skip where it is absent, the
// fixture tests above cover the same logic everywhere.
func debianRelease(t *testing.T) string {
	m, _ := filepath.Glob("/lib/modules/*/modules.dep")
	for _, p := range m {
		r := filepath.Base(filepath.Dir(p))
		if strings.HasSuffix(r, "-amd64") {
			return r
		}
	}
	t.Skip("no Debian kernel modules in /lib/modules: install linux-image-amd64 to test against them")
	return ""
}

func TestResolveRealDebianKernel(t *testing.T) {
	r := debianRelease(t)
	set, err := Resolve(Config{Release: r, Modaliases: []string{nvmeAlias, eduAlias, virtioAlias}})
	require.NoError(t, err)
	names := set.Names()
	// Debian 6.1 builds the virtio drivers as modules.
	for _, want := range []string{"virtio", "virtio_ring", "virtio_pci", "virtio_console", "virtio_net", "nvme", "nvme_core"} {
		require.Contains(t, names, want)
	}
	pos := map[string]int{}
	for i, n := range names {
		_, dup := pos[n]
		require.False(t, dup, "%s twice", n)
		pos[n] = i
	}
	require.Less(t, pos["virtio"], pos["virtio_pci"])
	require.Less(t, pos["virtio_ring"], pos["virtio_net"])
	require.Less(t, pos["nvme_core"], pos["nvme"])
	require.Equal(t, []string{eduAlias}, set.Unmatched)
	for _, m := range set.Modules {
		require.True(t, bytes.HasPrefix(m.Data, []byte("\x7fELF")), m.Path)
	}
}

// TestMatchRealAliases checks Match against every line of the Debian
// kernel's modules.alias that a known device modalias should or should
// not match, as kmod's fnmatch does.
func TestMatchRealAliases(t *testing.T) {
	r := debianRelease(t)
	f, err := os.Open(filepath.Join("/lib/modules", r, "modules.alias"))
	require.NoError(t, err)
	defer f.Close()
	matches := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) != 3 {
			continue
		}
		for _, a := range []string{nvmeAlias, usbAlias, virtioAlias} {
			if Match(fl[1], a) {
				matches[a] = append(matches[a], fl[2])
			}
		}
	}
	require.Equal(t, []string{"nvme"}, dedup(matches[nvmeAlias]))
	require.Equal(t, []string{"uas", "usb_storage"}, dedup(matches[usbAlias]), "the [0-2] class matches d0150")
	require.Equal(t, []string{"virtio_pci"}, dedup(matches[virtioAlias]))
}

func dedup(s []string) []string {
	var out []string
	for _, x := range s {
		if !slicesContains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pat, s string
		want   bool
	}{
		{"usb:v13FDp3940d0[0-2]*dc*", "usb:v13FDp3940d0150dc00", true},
		{"usb:v13FDp3940d0[0-2]*dc*", "usb:v13FDp3940d0350dc00", false},
		{"usb:v152Dp0567d011[4-7]dc*", "usb:v152Dp0567d0116dc08", true},
		{"usb:v152Dp0567d011[4-7]dc*", "usb:v152Dp0567d0118dc08", false},
		{"a[!0-2]b", "a3b", true},
		{"a[!0-2]b", "a1b", false},
		{"a[^0-2]b", "a3b", true},
		{"a[]]b", "a]b", true},
		{"a[]-]b", "a-b", true},
		{"a[x", "a[x", true}, // unclosed: a literal '['
		{"a[x", "ax", false},
		{"*", "", true},
		{"*", "a/b", true}, // '/' is an ordinary byte, unlike path.Match
		{"a*b*c", "a/xb/yc", true},
		{"a*b*c", "abx", false},
		{"?", "", false},
		{"a\\*", "a*", true},
		{"a\\*", "ab", false},
		{"pci:v*d*sv*sd*bc01sc08i02*", nvmeAlias, true},
		{"pci:v*d*sv*sd*bc01sc08i02*", eduAlias, false},
		{"", "", true},
		{"", "a", false},
	} {
		require.Equal(t, c.want, Match(c.pat, c.s), "%q ~ %q", c.pat, c.s)
	}
}

// FuzzMatch checks Match against a plain recursive fnmatch, and that it
// never panics, on any pattern and string.
func FuzzMatch(f *testing.F) {
	f.Add("usb:v13FDp3940d0[0-2]*dc*", "usb:v13FDp3940d0150dc00")
	f.Add("a[!]x-z]*?\\", "a]q\\")
	f.Fuzz(func(t *testing.T, pat, s string) {
		if len(pat) > 64 || len(s) > 64 {
			return
		}
		if got, want := Match(pat, s), refMatch(pat, s); got != want {
			t.Fatalf("Match(%q, %q) = %v, reference %v", pat, s, got, want)
		}
	})
}

// refMatch is fnmatch by plain recursion, the reference for FuzzMatch.
func refMatch(p, s string) bool {
	if p == "" {
		return s == ""
	}
	switch p[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if refMatch(p[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && refMatch(p[1:], s[1:])
	case '\\':
		if len(p) == 1 {
			return s != "" && s[0] == '\\' && refMatch("", s[1:])
		}
		return s != "" && s[0] == p[1] && refMatch(p[2:], s[1:])
	case '[':
		if s != "" {
			if ok, end, valid := matchClass(p, 0, s[0]); valid {
				return ok && refMatch(p[end:], s[1:])
			}
		}
	}
	return s != "" && s[0] == p[0] && refMatch(p[1:], s[1:])
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"rdma_rxe", "nfs", "9pnet_fd", "nvidia-uvm", strings.Repeat("a", MaxName)} {
		require.NoError(t, ValidateName(ok), ok)
	}
	for _, bad := range []string{"", "a/b", "../x", "nfs.ko", "x y", "x\n", strings.Repeat("a", MaxName+1)} {
		require.Error(t, ValidateName(bad), "%q", bad)
	}
}
