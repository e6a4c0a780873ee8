package vmm

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// PMEMConfig is a read-only file system image the guest sees as persistent
// memory (issue 31, docs/job-images.md): bytes [Offset, Offset+Size) of
// the file at Path, mapped into a KVM_MEM_READONLY memslot above guest RAM
// (addrspace.NewWindowsPMEM) and described to the guest's kernel as an
// e820 type-12 range, which Linux's nd_e820 and nd_pmem make /dev/pmem0.
// It takes no guest RAM (it does not count against Memory), no hugepages,
// and is never DMA-mapped for passthrough devices: only the pages the guest
// reads are ever read, through the host's page cache, which every VM
// booting the same file shares.
type PMEMConfig struct {
	// Path is the image file; empty for none. It is opened once, read-only,
	// with the rights of Config.ActingFor.
	Path string
	// File, when set, is Path already open (read-only) and checked by the
	// caller (package imagefile): New takes a duplicate of it instead of
	// opening Path again, so the bytes checked are the bytes mapped. The
	// caller keeps and closes its own.
	File *os.File
	// Offset is where the file system starts in the file (a SIF's
	// partition), a multiple of 4096; Size its length.
	Offset, Size int64
}

// pmemPageSize is the host page the file is mapped by.
const pmemPageSize = 4096

// validate checks the fields that need no file.
func (p PMEMConfig) validate() []error {
	if p.Path == "" {
		if p.Offset != 0 || p.Size != 0 {
			return []error{fieldErr("PMEM", "an offset and size without a path: give the image file")}
		}
		return nil
	}
	var errs []error
	if p.Offset < 0 || p.Offset%pmemPageSize != 0 {
		errs = append(errs, fieldErr("PMEM", "%s: offset %d is not a multiple of %d: the image must start on a page to be mapped", p.Path, p.Offset, pmemPageSize))
	}
	if p.Size <= 0 || p.Size > addrspace.MaxPMEM {
		errs = append(errs, fieldErr("PMEM", "%s: size %d outside 1 to %d bytes", p.Path, p.Size, int64(addrspace.MaxPMEM)))
	}
	return errs
}

// fileIdentity is what says a file is still the one hpcvmm opened:
// device, inode, size and modification time.
type fileIdentity struct {
	dev, ino uint64
	size     int64
	mtime    unix.Timespec
}

func identityOf(f *os.File) (fileIdentity, uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileIdentity{}, 0, err
	}
	return fileIdentity{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim}, st.Mode, nil
}

// pmemImage is the open image file, its identity when opened and, once
// mapped, the host mappings behind its memslots.
type pmemImage struct {
	cfg  PMEMConfig
	file *os.File
	id   fileIdentity
	// data maps the file's pages [Offset, Offset+Size rounded up to a
	// page) PROT_READ, MAP_SHARED; pad maps anonymous zero pages
	// PROT_READ from there to the 2 MiB-aligned end of the guest range
	// (nil when there is none).
	data, pad []byte
}

// openPMEM opens the image read-only with open (Config.openFile: the
// acting user's rights) and checks it before anything on the host
// changes: a regular file holding [Offset, Offset+Size).
func openPMEM(open func(string) (*os.File, error), cfg PMEMConfig) (*pmemImage, error) {
	if cfg.File != nil {
		open = func(string) (*os.File, error) {
			fd, err := unix.FcntlInt(cfg.File.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("%s: duplicating its descriptor: %w", cfg.Path, err)
			}
			return os.NewFile(uintptr(fd), cfg.Path), nil
		}
	}
	f, err := open(cfg.Path)
	if err != nil {
		return nil, fieldErr("PMEM", "%v", err)
	}
	id, mode, err := identityOf(f)
	if err != nil {
		f.Close()
		return nil, fieldErr("PMEM", "%s: %v", cfg.Path, err)
	}
	if mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fieldErr("PMEM", "%s is not a regular file: the image must be a file hpcvmm can map", cfg.Path)
	}
	if cfg.Offset > id.size || cfg.Size > id.size-cfg.Offset {
		f.Close()
		return nil, fieldErr("PMEM", "%s: bytes [%d, +%d) lie past its end (%d bytes): the file is truncated; copy it again", cfg.Path, cfg.Offset, cfg.Size, id.size)
	}
	cfg.File = nil // the duplicate is the image's from here on
	return &pmemImage{cfg: cfg, file: f, id: id}, nil
}

// changed says how the file differs from when it was opened, or "" when
// it does not: a truncation under a running VM is what makes KVM_RUN fail
// with EFAULT (see vcpu.go).
func (p *pmemImage) changed() string {
	now, _, err := identityOf(p.file)
	switch {
	case err != nil:
		return fmt.Sprintf("cannot be checked: %v", err)
	case now.size != p.id.size:
		return fmt.Sprintf("changed size from %d to %d bytes", p.id.size, now.size)
	case now != p.id:
		return "was modified"
	}
	return ""
}

// mapFile maps the image for its memslots: the file's pages PROT_READ,
// MAP_SHARED (never written, so they stay the page cache's pages, shared
// with every other VM booting the file), and zero pages up to guestSize,
// the range's 2 MiB-aligned size. Never hugepage-backed: the page cache
// gives 4 KiB pages. hpcvmm itself never reads these mappings: a page the
// file lost to truncation would be SIGBUS in the VMM.
func (p *pmemImage) mapFile(guestSize uint64) error {
	if err := p.checkUnchanged(); err != nil {
		return err
	}
	fileLen := addrspace.AlignUp(uint64(p.cfg.Size), pmemPageSize)
	if guestSize < fileLen {
		return fmt.Errorf("image %s: guest range of %d bytes is smaller than its %d", p.cfg.Path, guestSize, fileLen)
	}
	var err error
	if p.data, err = unix.Mmap(int(p.file.Fd()), p.cfg.Offset, int(fileLen), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("image %s: mmap: %w (the file system it is on must support shared mappings)", p.cfg.Path, err)
	}
	if pad := guestSize - fileLen; pad > 0 {
		if p.pad, err = unix.Mmap(-1, 0, int(pad), unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE); err != nil {
			return fmt.Errorf("image %s: mmap the range's padding: %w", p.cfg.Path, err)
		}
	}
	return nil
}

// checkUnchanged checks the file is still the one openPMEM checked, just
// before it is mapped.
func (p *pmemImage) checkUnchanged() error {
	if what := p.changed(); what != "" {
		return fmt.Errorf("image %s %s since hpcvmm opened it: launch again once it is written", p.cfg.Path, what)
	}
	return nil
}

// install gives the mappings to KVM as read-only memslots at gpa: a guest
// write to them exits as KVM_EXIT_MMIO, which guard refuses.
func (p *pmemImage) install(slots *memslots, gpa uint64) error {
	if _, err := slots.add(gpa, p.data, uapi.MemReadonly); err != nil {
		return fmt.Errorf("image %s: %w", p.cfg.Path, err)
	}
	if len(p.pad) > 0 {
		if _, err := slots.add(gpa+uint64(len(p.data)), p.pad, uapi.MemReadonly); err != nil {
			return fmt.Errorf("image %s: padding: %w", p.cfg.Path, err)
		}
	}
	return nil
}

// close unmaps the image and closes the file, after the KVM VM is gone
// (its memslots point at the mappings).
func (p *pmemImage) close() error {
	var errs []error
	for _, m := range [][]byte{p.data, p.pad} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	p.data, p.pad = nil, nil
	if p.file != nil {
		errs = append(errs, p.file.Close())
		p.file = nil
	}
	return errors.Join(errs...)
}

// errPMEMWrite is the refusal of a guest write to the image: one value,
// so the exit path allocates nothing.
var errPMEMWrite = errors.New("guest wrote to the read-only image (pmem): write ignored, the file is unchanged")

// errPMEMRead is the refusal of a read that exited: the memslots serve
// every read, so only an access KVM had to emulate gets here; it reads
// zeros, never the mapping (which could fault in the VMM).
var errPMEMRead = errors.New("guest read of the read-only image (pmem) exited to hpcvmm: read as zeros")

// pmemGuard is the MMIO device over the image's range: it sees only what
// the read-only memslots send out of KVM, chiefly writes, and refuses it
// to the VM's rate-limited log.
type pmemGuard struct {
	refusals *platform.Refusals
}

// pmemRefusalKind is the Refusals kind of the image's refusals.
const pmemRefusalKind = "pmem image"

// Write ignores the write and logs it, rate-limited.
func (g pmemGuard) Write(_ uint64, _ []byte) { g.refusals.Refuse(pmemRefusalKind, errPMEMWrite) }

// Read returns zeros.
func (g pmemGuard) Read(_ uint64, data []byte) {
	clear(data)
	g.refusals.Refuse(pmemRefusalKind, errPMEMRead)
}

// addPMEM maps the image into the guest-physical range the windows give
// it, as read-only memslots, with the guard over the range on the MMIO
// bus. Over 0 images it does nothing.
func (vm *VM) addPMEM() error {
	p := vm.dev.pmem
	if p == nil {
		return nil
	}
	if err := vm.kvm.RequireCaps(uapi.CapReadonlyMem); err != nil {
		return fmt.Errorf("image %s: %w", p.cfg.Path, err)
	}
	r := vm.windows.PMEM
	if err := p.mapFile(r.Size); err != nil {
		return err
	}
	if err := setupFault("map image"); err != nil {
		return err
	}
	if err := p.install(vm.dev.slots, r.GPA); err != nil {
		return err
	}
	if err := setupFault("image memslots"); err != nil {
		return err
	}
	if err := vm.dev.mmio.Register(r.GPA, r.Size, "pmem image", pmemGuard{refusals: vm.refusals}); err != nil {
		return err
	}
	vm.log.Info("image mapped as persistent memory", "path", p.cfg.Path, "offset", p.cfg.Offset, "size", p.cfg.Size,
		"guest_range", r.String())
	return nil
}

// isGuestMemoryFault says whether KVM_RUN's error is EFAULT: KVM could not
// get a host page behind a memslot. For the image's slots that happens
// when the file lost the page (truncated under the running VM): the page
// fault KVM takes on the mapping is SIGBUS for a process, EFAULT for
// KVM_RUN, and hpcvmm ends the VM with imageFault's reason.
func isGuestMemoryFault(err error) bool { return errors.Is(err, syscall.EFAULT) }

// guestMemoryFault is Run's error when a vCPU stopped on EFAULT. When the
// image changed since it was opened it says so: a file truncated under a
// running VM has lost pages the guest maps, the guest cannot be given an
// I/O error for a memory read (there is no such thing for a load from
// pmem), so the VM ends with this reason rather than the VMM with a
// SIGBUS, which it never takes because it never reads the mapping itself.
func (vm *VM) guestMemoryFault(reason error) error {
	if p := vm.dev.pmem; p != nil {
		if what := p.changed(); what != "" {
			return fmt.Errorf("the image %s %s while the VM ran, so the guest lost pages of it and hpcvmm ended the VM: never modify an image in use; write a new image to a new file (%w)", p.cfg.Path, what, reason)
		}
	}
	return fmt.Errorf("KVM could not reach guest memory on the host (EFAULT): %w", reason)
}
