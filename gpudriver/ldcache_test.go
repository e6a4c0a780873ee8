package gpudriver

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// encodeLdCache writes entries as glibc's ldconfig writes
// /etc/ld.so.cache (format 1.1, no extensions), for the round trip.
func encodeLdCache(entries []CacheEntry) []byte {
	strOff := cacheHeaderSize + cacheEntrySize*len(entries)
	var strs []byte
	add := func(s string) uint32 {
		off := uint32(strOff + len(strs))
		strs = append(append(strs, s...), 0)
		return off
	}
	le := binary.LittleEndian
	b := make([]byte, cacheHeaderSize, strOff)
	copy(b, cacheMagic)
	le.PutUint32(b[20:], uint32(len(entries)))
	for _, e := range entries {
		var flags uint32 = 1 // FLAG_ELF
		if e.Libc6 {
			flags = flagELFLibc6
		}
		if i := slices.Index(archNames, e.Arch); i > 0 && e.Arch != "" {
			flags |= uint32(i) << flagArchShift
		}
		rec := make([]byte, cacheEntrySize)
		le.PutUint32(rec, flags)
		le.PutUint32(rec[4:], add(e.Name))
		le.PutUint32(rec[8:], add(e.Path))
		b = append(b, rec...)
	}
	le.PutUint32(b[24:], uint32(len(strs)))
	return append(b, strs...)
}

func TestParseLdCacheRoundTrip(t *testing.T) {
	want := fixtureCache(t)
	require.Len(t, want, 520, "the count line of ldconfig-p.txt")
	want = append(want, CacheEntry{Name: "libcuda.so.1", Path: "/usr/lib/i386-linux-gnu/libcuda.so.1", Libc6: true},
		CacheEntry{Name: "libx.so", Path: "/usr/libx32/libx.so", Libc6: true, Arch: "x32"})
	got, err := ParseLdCache(encodeLdCache(want))
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Find reads the binary cache from the root when given none.
	root, cache := fakeHost(t, fixtureModule, fixtureModule)
	require.NoError(t, os.MkdirAll(root+"/etc", 0o755))
	require.NoError(t, os.WriteFile(root+"/etc/ld.so.cache", encodeLdCache(cache), 0o644))
	d, err := Find(Options{Root: root})
	require.NoError(t, err)
	require.Equal(t, []Library{{File: "/usr/lib/x86_64-linux-gnu/libcuda.so." + fixtureModule,
		Links: []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.1"}, Is64: true}}, d.Libraries)
}

// TestParseLdCacheAsLdconfig: this machine's /etc/ld.so.cache parses to
// what its own ldconfig -p prints. Where either is missing (a system
// without glibc's ldconfig) the round trip above still runs.
func TestParseLdCacheAsLdconfig(t *testing.T) {
	b, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Skipf("no /etc/ld.so.cache here: %v", err)
	}
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	text, err := exec.Command(ldconfig, "-p").Output()
	if err != nil {
		t.Skipf("ldconfig -p: %v", err)
	}
	want, err := ParseLdconfig(text)
	require.NoError(t, err)
	got, err := ParseLdCache(b)
	require.NoError(t, err)
	require.NotEmpty(t, got)
	require.Equal(t, want, got)
}

func TestParseLdCacheRefuses(t *testing.T) {
	good := encodeLdCache([]CacheEntry{{Name: "libc.so.6", Path: "/lib/libc.so.6", Libc6: true, Arch: "x86-64"}})
	for name, mutate := range map[string]func([]byte) []byte{
		"old format":  func(b []byte) []byte { return append([]byte("ld.so-1.7.0"), b...) },
		"short":       func(b []byte) []byte { return b[:40] },
		"too many":    func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 1<<30); return b },
		"offset past": func(b []byte) []byte { binary.LittleEndian.PutUint32(b[cacheHeaderSize+4:], uint32(len(b))); return b },
		"no NUL":      func(b []byte) []byte { return b[:len(b)-1] },
		"relative": func(b []byte) []byte {
			i := strings.Index(string(b), "/lib/libc.so.6")
			b[i] = 'x'
			return b
		},
	} {
		_, err := ParseLdCache(mutate(slices.Clone(good)))
		require.Error(t, err, name)
	}
	_, err := ParseLdconfig([]byte("\tlibfoo.so (libc6) => lib/libfoo.so\n"))
	require.ErrorContains(t, err, "line 1")
	_, err = ParseLdconfig([]byte("\tlibfoo.so libc6 => /lib/libfoo.so\n"))
	require.ErrorContains(t, err, "NAME (FLAGS) => PATH")
	e, err := ParseLdconfig([]byte("\tlibfoo.so.1 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/libfoo.so.1\n\tlibbar.so (libc6, hwcap: 0x0000000000000008) => /lib/libbar.so\n"))
	require.NoError(t, err)
	require.Equal(t, []CacheEntry{{Name: "libfoo.so.1", Path: "/lib/libfoo.so.1", Libc6: true, Arch: "x86-64"},
		{Name: "libbar.so", Path: "/lib/libbar.so", Libc6: true}}, e)
}

// FuzzParsers: the parsers of what a host (or, for /proc/devices and the
// capability files, a guest) hands over never panic, and what they return
// keeps their promises: cache entries with a plain name and an absolute,
// clean path; majors from 1 to MaxMajor with a plain name; a permission
// mode; a driver version.
func FuzzParsers(f *testing.F) {
	for _, p := range []string{"testdata/ldconfig-p.txt", "testdata/proc-devices.txt", hostRoot + "/proc/devices",
		hostRoot + "/proc/driver/nvidia/version", hostRoot + "/proc/driver/nvidia/capabilities/mig/config"} {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add(encodeLdCache(fixtureCache(f)[:8]))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(es []CacheEntry) {
			for _, e := range es {
				require.True(t, strings.HasPrefix(e.Path, "/") && path.Clean(e.Path) == e.Path, "%q", e.Path)
				require.False(t, e.Name == "" || strings.ContainsAny(e.Name, "/\x00"), "%q", e.Name)
			}
		}
		if es, err := ParseLdconfig(b); err == nil {
			check(es)
		}
		if es, err := ParseLdCache(b); err == nil {
			check(es)
		}
		if m, err := ParseProcDevices(b); err == nil {
			for name, maj := range m {
				require.True(t, maj >= 1 && maj <= MaxMajor, "%s %d", name, maj)
				require.False(t, name == "" || strings.ContainsAny(name, " \t\n"), "%q", name)
			}
			if nodes, err := Nodes(m, 2, []Cap{{Minor: 1, Mode: 0o400}}); err == nil {
				for _, n := range nodes {
					require.True(t, n.Major >= 1 && n.Major <= MaxMajor && path.Clean(n.Path) == n.Path, "%+v", n)
				}
			}
		}
		if c, err := ParseCapability(b); err == nil {
			require.Equal(t, c.Mode, c.Mode.Perm(), "%v", c.Mode)
			require.Less(t, c.Minor, uint32(1<<20))
		}
		if v, err := ParseVersion(b); err == nil {
			require.True(t, IsDriverVersion(v), v)
		}
	})
}
