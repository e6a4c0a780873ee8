package kmodules

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/kmodules/kmodtest"
)

// modinfoTool returns what modinfo(8) (kmod) prints of field for the
// module file p, one value a line, or false where kmod is not installed.
func modinfoTool(t *testing.T, field, p string) ([]string, bool) {
	t.Helper()
	tool, err := exec.LookPath("modinfo")
	if err != nil {
		if tool, err = exec.LookPath("/usr/sbin/modinfo"); err != nil {
			return nil, false
		}
	}
	out, err := exec.Command(tool, "-F", field, p).Output()
	require.NoError(t, err, "modinfo -F %s %s", field, p)
	return strings.Fields(string(out)), true
}

func dedupNames(s []string) []string {
	var out []string
	for _, x := range s {
		if !slicesContains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// TestParseModinfoHandBuilt: kmodtest's object is read as a module by
// ParseModinfo and, where kmod is installed, by modinfo(8) itself, with
// the same firmware names (each once) and version.
func TestParseModinfoHandBuilt(t *testing.T) {
	obj := kmodtest.Object("license=Dual MIT/GPL", "firmware=nvidia/1.2.3/gsp_ga10x.bin", "version=1.2.3",
		"alias=pci:v000010DEd*sv*sd*bc03sc02i00*", "firmware=nvidia/1.2.3/gsp_tu10x.bin", "firmware=nvidia/1.2.3/gsp_ga10x.bin")
	info, err := ParseModinfo(obj)
	require.NoError(t, err)
	require.Equal(t, ModInfo{Firmware: []string{"nvidia/1.2.3/gsp_ga10x.bin", "nvidia/1.2.3/gsp_tu10x.bin"}, Version: "1.2.3"}, info)

	p := filepath.Join(t.TempDir(), "nvidia.ko")
	require.NoError(t, os.WriteFile(p, obj, 0o644))
	if fw, ok := modinfoTool(t, "firmware", p); ok {
		require.Equal(t, info.Firmware, dedupNames(fw), "modinfo(8) reads the same object")
		v, _ := modinfoTool(t, "version", p)
		require.Equal(t, []string{"1.2.3"}, v)
	} else {
		t.Log("kmod's modinfo is not installed: the object is checked by debug/elf only")
	}
}

// TestParseModinfoCompiled: a C object compiled by gcc, its .modinfo laid
// out by the compiler and assembler as a module's MODULE_FIRMWARE is.
func TestParseModinfoCompiled(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.SkipOrFail(t, "no gcc to compile a module-like object: install gcc")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "m.c")
	require.NoError(t, os.WriteFile(src, []byte(`
__attribute__((section(".modinfo"), used, aligned(1))) static const char fw[] = "firmware=nvidia/1.2.3/gsp_x.bin";
__attribute__((section(".modinfo"), used, aligned(1))) static const char ver[] = "version=1.2.3";
__attribute__((section(".modinfo"), used, aligned(1))) static const char fw2[] = "firmware=amdgpu/navi10_sos.bin";
int f(void) { return 0; }
`), 0o644))
	obj := filepath.Join(dir, "m.ko")
	out, err := exec.Command(gcc, "-c", "-O2", "-o", obj, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	b, err := os.ReadFile(obj)
	require.NoError(t, err)
	info, err := ParseModinfo(b)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"nvidia/1.2.3/gsp_x.bin", "amdgpu/navi10_sos.bin"}, info.Firmware)
	require.Equal(t, "1.2.3", info.Version)
	if fw, ok := modinfoTool(t, "firmware", obj); ok {
		require.ElementsMatch(t, info.Firmware, fw)
	}
}

// TestParseModinfoRealModule: a module of this machine's Debian kernel
// that names firmware (r8169, Realtek's NICs: rtl_nic/...) reads as
// modinfo(8) reads it, and Resolve gives the same names to its Set.
func TestParseModinfoRealModule(t *testing.T) {
	r := debianRelease(t)
	set, err := Resolve(Config{Release: r, Modules: []string{"r8169"}})
	var unknown *UnknownModuleError
	if errors.As(err, &unknown) {
		testenv.SkipOrFail(t, "kernel %s has no r8169 module (a Debian amd64 kernel has): %v", r, err)
	}
	require.NoError(t, err)
	var m *Module
	for i := range set.Modules {
		if set.Modules[i].Name == "r8169" {
			m = &set.Modules[i]
		}
	}
	require.NotNil(t, m)
	require.NoError(t, m.ModinfoErr)
	require.Greater(t, len(m.Firmware), 5, "r8169 names a firmware file per chip revision")
	for _, n := range m.Firmware {
		require.True(t, strings.HasPrefix(n, "rtl_nic/"), n)
	}
	require.Equal(t, m.Firmware[0], set.Firmware()[0].Name)
	require.Equal(t, "r8169", set.Firmware()[0].Module)
	if fw, ok := modinfoTool(t, "firmware", filepath.Join("/lib/modules", r, m.File)); ok {
		require.Equal(t, dedupNames(fw), m.Firmware)
	}
	info, err := ModuleInfo("", r, "r8169")
	require.NoError(t, err)
	require.Equal(t, m.Firmware, info.Firmware, "ModuleInfo reads the file's .modinfo alone")
}

func TestParseModinfoRefuses(t *testing.T) {
	for _, bad := range []string{"/lib/firmware/x.bin", "../x.bin", "a/../../x", "a/../b", "..", ".", "", "a//b", "./a", "a/", "a\nb", "a\x01b",
		strings.Repeat("a", MaxFirmwareName+1)} {
		_, err := ParseModinfo(kmodtest.Object("firmware=" + bad))
		var fe *FirmwareNameError
		require.ErrorAs(t, err, &fe, "%q", bad)
		require.Equal(t, bad, fe.Name)
		require.NotContains(t, err.Error(), "\n")
	}
	for _, ok := range []string{"a", "nvidia/580.159.04/gsp_ga10x.bin", "brcm/brcmfmac43455-sdio.raspberrypi,4-model-b.txt", "a..b/c", strings.Repeat("a", MaxFirmwareName)} {
		info, err := ParseModinfo(kmodtest.Object("firmware=" + ok))
		require.NoError(t, err, "%q", ok)
		require.Equal(t, []string{ok}, info.Firmware)
	}
	_, err := ParseModinfo([]byte("\x7fELF fixture module virtio\n"))
	require.ErrorContains(t, err, "not an ELF object")
	noInfo := kmodtest.Object()
	copy(noInfo[bytes.Index(noInfo, []byte(".modinfo")):], ".modinfX") // the section's name
	_, err = ParseModinfo(noInfo)
	require.ErrorContains(t, err, "no .modinfo section")
	// Version records that are no printable word are not shown.
	info, err := ParseModinfo(kmodtest.Object("version=1.0\x1b[31m"))
	require.NoError(t, err)
	require.Empty(t, info.Version)
}

// TestModuleInfo: the one module's .modinfo from a modules directory,
// uncompressed or zstd-compressed; a module modules.dep lacks is an
// UnknownModuleError; a bad name names the module.
func TestModuleInfo(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(dir, "6.1.0-x")
	require.NoError(t, os.MkdirAll(filepath.Join(rel, "updates/dkms"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(rel, "modules.dep"), []byte(
		"updates/dkms/nvidia.ko:\nupdates/dkms/nvidia-uvm.ko.zst: updates/dkms/nvidia.ko\nupdates/dkms/evil.ko:\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rel, "updates/dkms/nvidia.ko"),
		kmodtest.Object("version=580.159.04", "firmware=nvidia/580.159.04/gsp_ga10x.bin", "firmware=nvidia/580.159.04/gsp_tu10x.bin"), 0o644))
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(rel, "updates/dkms/nvidia-uvm.ko.zst"),
		enc.EncodeAll(kmodtest.Object("version=580.159.04"), nil), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rel, "updates/dkms/evil.ko"), kmodtest.Object("firmware=../../etc/shadow"), 0o644))

	info, err := ModuleInfo(dir, "6.1.0-x", "nvidia")
	require.NoError(t, err)
	require.Equal(t, ModInfo{Firmware: []string{"nvidia/580.159.04/gsp_ga10x.bin", "nvidia/580.159.04/gsp_tu10x.bin"}, Version: "580.159.04"}, info)
	info, err = ModuleInfo(dir, "6.1.0-x", "nvidia-uvm")
	require.NoError(t, err)
	require.Equal(t, ModInfo{Version: "580.159.04"}, info)
	_, err = ModuleInfo(dir, "6.1.0-x", "nouveau")
	var unknown *UnknownModuleError
	require.ErrorAs(t, err, &unknown)
	_, err = ModuleInfo(dir, "6.1.0-x", "evil")
	var fe *FirmwareNameError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "evil", fe.Module)
	_, err = ModuleInfo(dir, "../x", "nvidia")
	require.Error(t, err)
}

// cleanRelative is the property every name ParseModinfo returns has,
// checked element by element (not by path.Clean, as the parser does).
func cleanRelative(n string) bool {
	if n == "" || len(n) > MaxFirmwareName || strings.HasPrefix(n, "/") {
		return false
	}
	for _, e := range strings.Split(n, "/") {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	for i := 0; i < len(n); i++ {
		if n[i] < 0x20 || n[i] == 0x7f {
			return false
		}
	}
	return true
}

// FuzzParseModinfo: on any bytes ParseModinfo never panics, and every
// firmware name it returns is a clean relative path that the object names
// in a firmware= record, each once.
func FuzzParseModinfo(f *testing.F) {
	f.Add(kmodtest.Object("firmware=nvidia/1.2.3/gsp_ga10x.bin", "version=1.2.3"))
	f.Add(kmodtest.Object("firmware=../x", "firmware=a"))
	f.Add(kmodtest.ObjectWithModinfo([]byte("firmware=a\x00\x00\x00firmware=/b")))
	f.Add([]byte("\x7fELF fixture module virtio\n"))
	f.Fuzz(func(t *testing.T, obj []byte) {
		info, err := ParseModinfo(obj)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, n := range info.Firmware {
			if !cleanRelative(n) {
				t.Fatalf("name %q is not a clean relative path", n)
			}
			if !bytes.Contains(obj, []byte("firmware="+n)) {
				t.Fatalf("name %q is in no firmware= record", n)
			}
			if seen[n] {
				t.Fatalf("name %q twice", n)
			}
			seen[n] = true
		}
	})
}

// FuzzModinfoSection: on any section bytes, the parser returns exactly
// the firmware= records' values, in order and each once, when every one
// is a clean relative path, and refuses the section when one is not.
func FuzzModinfoSection(f *testing.F) {
	f.Add([]byte("license=GPL\x00firmware=nvidia/1.2.3/gsp_ga10x.bin\x00version=1.2.3\x00"))
	f.Add([]byte("firmware=a\x00\x00firmware=a\x00firmware=b/../c\x00"))
	f.Add([]byte("firmware=\x00firmware=/abs"))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := parseModinfoSection(data)
		var want []string
		valid := true
		for _, rec := range strings.Split(string(data), "\x00") {
			if v, ok := strings.CutPrefix(rec, "firmware="); ok {
				valid = valid && cleanRelative(v)
				if !slicesContains(want, v) {
					want = append(want, v)
				}
			}
		}
		if !valid {
			var fe *FirmwareNameError
			if !errors.As(err, &fe) {
				t.Fatalf("a bad name was not refused: %v, %q", err, info.Firmware)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid names refused: %v", err)
		}
		if len(want) != len(info.Firmware) {
			t.Fatalf("got %q, want %q", info.Firmware, want)
		}
		for i := range want {
			if want[i] != info.Firmware[i] {
				t.Fatalf("got %q, want %q", info.Firmware, want)
			}
		}
	})
}
