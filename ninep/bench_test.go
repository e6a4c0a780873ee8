package ninep

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"
)

// benchSizes are the message sizes measured (package documentation).
var benchSizes = []uint32{128 << 10, 512 << 10, 1 << 20}

// benchFile is the sequential benchmarks' file size: 16 MiB, a 256 MiB
// run scaled down for a 2-core machine; b.N repeats it.
const benchFile = 16 << 20

// BenchmarkServerSequentialRead reads a file front to back through the p9
// client over a socket pair, each read as large as msize allows.
func BenchmarkServerSequentialRead(b *testing.B) {
	for _, msize := range benchSizes {
		b.Run(fmt.Sprintf("msize=%dK", msize>>10), func(b *testing.B) {
			fx := newFixture(b)
			require.NoError(b, os.WriteFile(filepath.Join(fx.export, "big"), bytes.Repeat([]byte{7}, benchFile), 0o644))
			_, root := fx.serve(b, false, Options{MaxMessageSize: msize}, msize)
			f, err := walk(root, "big")
			require.NoError(b, err)
			_, _, err = f.Open(p9.ReadOnly)
			require.NoError(b, err)
			buf := make([]byte, msize-4096)
			b.SetBytes(benchFile)
			b.ReportAllocs()
			b.ResetTimer()
			msgs := 0
			for range b.N {
				for off := int64(0); off < benchFile; {
					n, err := f.ReadAt(buf, off)
					if err != nil || n == 0 {
						b.Fatal(n, err)
					}
					off += int64(n)
					msgs++
				}
			}
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
		})
	}
}

// BenchmarkServerSequentialWrite writes a file front to back.
func BenchmarkServerSequentialWrite(b *testing.B) {
	for _, msize := range benchSizes {
		b.Run(fmt.Sprintf("msize=%dK", msize>>10), func(b *testing.B) {
			fx := newFixture(b)
			_, root := fx.serve(b, false, Options{MaxMessageSize: msize}, msize)
			_, f, err := root.Walk(nil)
			require.NoError(b, err)
			_, _, _, err = f.Create("big", p9.WriteOnly, 0o644, p9.NoUID, p9.NoGID)
			require.NoError(b, err)
			buf := bytes.Repeat([]byte{9}, int(msize-4096))
			b.SetBytes(benchFile)
			b.ReportAllocs()
			b.ResetTimer()
			msgs := 0
			for range b.N {
				for off := int64(0); off < benchFile; {
					n, err := f.WriteAt(buf[:min(len(buf), benchFile-int(off))], off)
					if err != nil {
						b.Fatal(err)
					}
					off += int64(n)
					msgs++
				}
			}
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
		})
	}
}

// BenchmarkServerCreateStat creates a small file, writes it, closes it
// and stats it by a fresh walk: the metadata path (6 messages an op).
func BenchmarkServerCreateStat(b *testing.B) {
	for _, msize := range benchSizes {
		b.Run(fmt.Sprintf("msize=%dK", msize>>10), func(b *testing.B) {
			fx := newFixture(b)
			_, root := fx.serve(b, false, Options{MaxMessageSize: msize}, msize)
			data := []byte("small file")
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				name := fmt.Sprintf("f%d", i)
				_, f, err := root.Walk(nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, _, err := f.Create(name, p9.WriteOnly, 0o644, p9.NoUID, p9.NoGID); err != nil {
					b.Fatal(err)
				}
				if _, err := f.WriteAt(data, 0); err != nil {
					b.Fatal(err)
				}
				f.Close()
				_, g, err := root.Walk([]string{name})
				if err != nil {
					b.Fatal(err)
				}
				if _, _, _, err := g.GetAttr(p9.AttrMaskAll); err != nil {
					b.Fatal(err)
				}
				g.Close()
			}
		})
	}
}
