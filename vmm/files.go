package vmm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapFile returns the contents of the file at path and the func that
// releases them. A regular file is mapped read-only rather than read into
// the Go heap: the kernel and initrd are copied into guest RAM once and
// never read again, and read into the heap they would stay resident in the
// VMM (the runtime keeps freed heap pages for a while and grows its heap
// goal with them) for the whole life of the VM; unmapped after loading,
// their page-cache pages stop counting against the VMM at once. Anything
// else (a pipe from process substitution) is read.
func mapFile(path string) (data []byte, release func(), err error) {
	data, _, release, err = mapFileInfo(path)
	return data, release, err
}

// mapFileInfo is mapFile that also returns the file's information, taken
// from the descriptor the bytes were mapped through.
func mapFileInfo(path string) (data []byte, st os.FileInfo, release func(), err error) {
	nothing := func() {}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nothing, err
	}
	defer f.Close()
	st, err = f.Stat()
	if err != nil {
		return nil, nil, nothing, err
	}
	if !st.Mode().IsRegular() {
		data, err := os.ReadFile(path)
		return data, st, nothing, err
	}
	if st.Size() == 0 {
		return nil, st, nothing, nil
	}
	if int64(int(st.Size())) != st.Size() {
		return nil, nil, nothing, fmt.Errorf("%s: %d bytes do not fit in this process's address space", path, st.Size())
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, nothing, fmt.Errorf("mmap %s: %w", path, err)
	}
	return m, st, func() { _ = unix.Munmap(m) }, nil
}
