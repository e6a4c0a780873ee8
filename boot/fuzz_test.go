package boot

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// fuzzMem is shared by fuzz iterations (which run one at a time per process)
// so each Load does not allocate fresh guest RAM.
var fuzzMem = newFakeMem(32 << 20)

// FuzzParseBzImage feeds arbitrary images to ParseBzImage and, when one
// parses, to Load: neither may panic, and an accepted kernel must satisfy
// the invariants Load relies on.
func FuzzParseBzImage(f *testing.F) {
	le := binary.LittleEndian
	f.Add(synthImage(nil))
	f.Add(synthImage(func(img []byte) { le.PutUint32(img[0x260:], 0xffffffff) }))
	f.Add(synthImage(func(img []byte) { le.PutUint64(img[0x258:], 0xffffffffffe00000) }))
	f.Add(synthImage(func(img []byte) { img[0x234] = 0; le.PutUint64(img[0x258:], 0) }))
	f.Add(synthImage(func(img []byte) { le.PutUint32(img[0x22c:], 0x17fffff) }))
	f.Add(synthImage(func(img []byte) { le.PutUint32(img[0x230:], 0x80000000) }))
	f.Add(synthImage(func(img []byte) { le.PutUint16(img[0x20e:], 0xffff) }))
	f.Add(synthImage(func(img []byte) { img[0x1f1] = 0xff })[:0x1000])
	f.Add([]byte("HdrS"))
	if paths, _ := filepath.Glob("/boot/vmlinuz-*"); len(paths) > 0 {
		if img, err := os.ReadFile(paths[0]); err == nil && len(img) > 0x4000 {
			// The real setup area plus a little payload keeps inputs small.
			setup := (int(img[0x1f1]) + 1) * 512
			f.Add(img[:min(len(img), setup+512)])
		}
	}
	f.Fuzz(func(t *testing.T, image []byte) {
		k, err := ParseBzImage(image)
		if err != nil {
			if k != nil {
				t.Fatalf("error %v with a non-nil kernel", err)
			}
			return
		}
		if k.Protocol < 0x0206 || k.XLoadFlags&1 == 0 || len(k.Payload) == 0 ||
			len(k.Header) < hdrHandoverOffset-bpHdr || bpHdr+len(k.Header) > bpHdrAreaEnd {
			t.Fatalf("accepted an image that breaks the invariants: %+v", k)
		}
		_, _ = Load(fuzzMem, Params{
			Kernel:  k,
			Initrd:  image[:len(image)%(64<<10)],
			Cmdline: "console=ttyS0",
			RAM:     []RAMRange{{0, uint64(len(fuzzMem.ram))}},
			CPUs:    1 + len(image)%8,
		})
	})
}
