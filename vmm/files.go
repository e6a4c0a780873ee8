package vmm

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/vmlinux"
)

// mapFile returns the contents of the file at path, opened with open, and the func that
// releases them. A regular file is mapped read-only rather than read into
// the Go heap: the kernel and initrd are copied into guest RAM once and
// never read again, and read into the heap they would stay resident in the
// VMM (the runtime keeps freed heap pages for a while and grows its heap
// goal with them) for the whole life of the VM; unmapped after loading,
// their page-cache pages stop counting against the VMM at once. Anything
// else (a pipe from process substitution) is read.
func mapFile(open func(string) (*os.File, error), path string) (data []byte, release func(), err error) {
	nothing := func() {}
	f, err := open(path)
	if err != nil {
		return nil, nothing, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nothing, err
	}
	if !st.Mode().IsRegular() {
		data, err := io.ReadAll(f)
		return data, nothing, err
	}
	if st.Size() == 0 {
		return nil, nothing, nil
	}
	if int64(int(st.Size())) != st.Size() {
		return nil, nothing, fmt.Errorf("%s: %d bytes do not fit in this process's address space", path, st.Size())
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, nothing, fmt.Errorf("mmap %s: %w", path, err)
	}
	return m, func() { _ = unix.Munmap(m) }, nil
}

// maxKernelFile bounds the kernel file readSealed copies into memory: the
// largest vmlinux hpcvmm unpacks (a bzImage is smaller still).
const maxKernelFile = vmlinux.MaxSize

// readSealed returns a private, immutable copy of the file at path (opened
// with open) and the
// func that releases it, with the file's information. The kernel is read
// this way, not mapped: a MAP_PRIVATE mapping still shows writes made to
// the file later, so the bytes the kernel cache's key is hashed from could
// differ from the bytes then decompressed and stored under that key, and a
// user able to write the file would choose the kernel every later VM booting
// the genuine bzImage runs. The copy is a sealed memfd (no write, grow or
// shrink; shmem, given back at release), not the Go heap, for the reason
// mapFile gives. The file must not change while it is copied: its size and
// times are compared before and after.
func readSealed(open func(string) (*os.File, error), path string) (data []byte, st os.FileInfo, release func(), err error) {
	nothing := func() {}
	f, err := open(path)
	if err != nil {
		return nil, nil, nothing, err
	}
	defer f.Close()
	st, err = f.Stat()
	if err != nil {
		return nil, nil, nothing, err
	}
	if !st.Mode().IsRegular() {
		// A pipe is read once: the bytes are this process's already.
		data, err := io.ReadAll(io.LimitReader(f, maxKernelFile+1))
		if err == nil && len(data) > maxKernelFile {
			err = fmt.Errorf("%s: more than %d bytes, larger than any kernel", path, maxKernelFile)
		}
		return data, st, nothing, err
	}
	if st.Size() == 0 {
		return nil, st, nothing, nil
	}
	if st.Size() > maxKernelFile {
		return nil, nil, nothing, fmt.Errorf("%s: %d bytes, larger than any kernel (%d)", path, st.Size(), maxKernelFile)
	}
	fd, err := unix.MemfdCreate("hpcvmm-kernel", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, nothing, fmt.Errorf("%s: memfd_create for its private copy: %w", path, err)
	}
	mf := os.NewFile(uintptr(fd), "hpcvmm-kernel")
	defer mf.Close() // the mapping keeps the memfd's pages
	n, err := io.Copy(mf, io.LimitReader(f, st.Size()+1))
	if err != nil {
		return nil, nil, nothing, fmt.Errorf("read %s: %w", path, err)
	}
	after, err := f.Stat()
	if err != nil {
		return nil, nil, nothing, err
	}
	if n != st.Size() || changed(st, after) {
		return nil, nil, nothing, fmt.Errorf("%s changed while hpcvmm read it (%d bytes, then %d): launch again once it is written", path, st.Size(), n)
	}
	if _, err := unix.FcntlInt(mf.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE|unix.F_SEAL_SEAL); err != nil {
		return nil, nil, nothing, fmt.Errorf("%s: seal its private copy: %w", path, err)
	}
	m, err := unix.Mmap(int(mf.Fd()), 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, nothing, fmt.Errorf("mmap the private copy of %s: %w", path, err)
	}
	return m, st, func() { _ = unix.Munmap(m) }, nil
}

// changed reports whether a file's size or times differ between two stats
// of one descriptor.
func changed(a, b os.FileInfo) bool {
	sa, oka := a.Sys().(*syscall.Stat_t)
	sb, okb := b.Sys().(*syscall.Stat_t)
	if !oka || !okb {
		return a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime())
	}
	return sa.Size != sb.Size || sa.Mtim != sb.Mtim || sa.Ctim != sb.Ctim
}
