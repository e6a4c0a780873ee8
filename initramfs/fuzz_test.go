package initramfs

import (
	"archive/tar"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/u-root/u-root/pkg/cpio"
)

// FuzzBuildFromTar builds an initramfs from arbitrary bytes given as a tar
// IMAGE. Property: no panic; when the build succeeds, the archive reads
// back as newc, every name in it is clean and inside the root, every
// record's parent directory precedes it, and the agent and module list are
// there.
func FuzzBuildFromTar(f *testing.F) {
	seed := func(ents ...[3]string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range ents {
			hdr := &tar.Header{Name: e[0], Typeflag: e[1][0], Mode: 0o755, Linkname: e[2]}
			if hdr.Typeflag == tar.TypeReg {
				hdr.Size = int64(len(e[2]))
				hdr.Linkname = ""
			}
			_ = tw.WriteHeader(hdr)
			if hdr.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte(e[2]))
			}
		}
		_ = tw.Close()
		return buf.Bytes()
	}
	f.Add(seed([3]string{"bin/sh", "0", "#!"}, [3]string{"lib", "2", "usr/lib"}, [3]string{"usr/lib/x", "0", "y"}))
	f.Add(seed([3]string{".hpcvmm/hpcvmm-agent", "0", "evil"}, [3]string{"dev", "2", "/"}, [3]string{"a", "1", "bin/sh"}))
	f.Add(seed([3]string{"lib", "2", "../.."}, [3]string{"tmp", "0", "file"}))
	agent := writeAgent(f, false)
	mods := fixtureModules(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		img := filepath.Join(dir, "image.tar")
		if err := os.WriteFile(img, data, 0o644); err != nil {
			t.Fatal(err)
		}
		im, err := rootfs.Open(img)
		if err != nil {
			return
		}
		res, err := Build(Config{Image: im, Agent: agent, Release: "6.1.0-test", HostModules: mods, CacheDir: filepath.Join(dir, "cache"), GuestMemory: 512 << 20})
		if err != nil {
			return
		}
		fh, err := os.Open(res.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(fh))
		if err != nil {
			t.Fatalf("the archive does not read back: %v", err)
		}
		written := map[string]uint64{"": cpio.S_IFDIR}
		for _, r := range recs {
			n := r.Name
			if n == "" || strings.HasPrefix(n, "/") || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") {
				t.Fatalf("record %q escapes or is not clean", n)
			}
			parent := path.Dir(n)
			if parent == "." {
				parent = ""
			}
			if _, ok := written[parent]; !ok {
				t.Fatalf("record %q before its parent", n)
			}
			written[n] = r.Mode & cpio.S_IFMT
		}
		if written[".hpcvmm/hpcvmm-agent"] != cpio.S_IFREG || written[".hpcvmm/modules"] != cpio.S_IFREG {
			t.Fatalf("agent or module list missing: %v", written)
		}
	})
}
