package rootfs

import (
	"os"
	"strconv"
	"testing"
)

// BenchmarkIndexTarExecutables: the index of a tar of 500 dynamic
// executables (the host's /bin/true), which now records each one's ELF
// interpreter from its first bytes.
func BenchmarkIndexTarExecutables(b *testing.B) {
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		b.Fatal(err)
	}
	ents := []tarEnt{dir("bin")}
	for i := range 500 {
		ents = append(ents, exe("bin/p"+strconv.Itoa(i), string(bin)))
	}
	p := writeFile(b, tarBytes(b, ents...))
	b.ReportAllocs()
	for b.Loop() {
		im, err := Open(p)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := im.Usage(); err != nil {
			b.Fatal(err)
		}
	}
}
