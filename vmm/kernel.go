package vmm

import (
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/vmlinux"
)

// KernelDecompress says where a bzImage's compressed kernel is unpacked.
type KernelDecompress string

// The decompression modes.
const (
	// DecompressHost (the default) unpacks the vmlinux on the host once,
	// keeps it in the kernel cache (Config.KernelCache) keyed by the
	// bzImage's SHA-256, and enters it at its 64-bit entry point. The
	// guest skips its decompressor, and with it KASLR: the kernel runs at
	// the physical and virtual addresses it was linked for.
	DecompressHost KernelDecompress = "host"
	// DecompressGuest enters the bzImage's own decompressor, as a boot
	// loader does: slower to start, with in-guest KASLR.
	DecompressGuest KernelDecompress = "guest"
)

// kernelImage is the kernel New boots. check is known at once (the
// bzImage, for the placement checks before any host change); the kernel to
// load may still be decompressing (or being read from the cache and
// verified) in the background, overlapping guest RAM's prefault, until
// wait.
type kernelImage struct {
	check *boot.Kernel
	done  chan struct{}
	boot  *boot.Kernel
	err   error
	// entry is the mapped cache file the kernel's segments alias (a
	// hit); decompressed is set when the vmlinux was unpacked on hpcvmm's
	// heap (a miss). release gives either back once the kernel is loaded.
	entry        *vmlinux.Entry
	decompressed bool
	// unmapImage releases cfg.Kernel's mapping, which a vmlinux ELF's
	// segments and a bzImage booted by its own decompressor alias.
	unmapImage func()
}

// openKernel reads and parses cfg.Kernel: a bzImage, or an uncompressed
// vmlinux ELF. For a bzImage with DecompressHost it opens the kernel cache
// (a directory another user may write is refused here, before the host
// changes) and starts the cache lookup, or on a miss the decompression, in
// a goroutine.
func (vm *VM) openKernel() (_ *kernelImage, err error) {
	cfg := &vm.cfg
	// One private copy, hashed, parsed and decompressed alike (readSealed
	// says why), off hpcvmm's heap (part of the VMM's own memory at the
	// guest's /init otherwise).
	image, info, unmap, err := readSealed(cfg.openFile, cfg.Kernel)
	if err != nil {
		return nil, fieldErr("Kernel", "%v", err)
	}
	ki := &kernelImage{done: make(chan struct{}), unmapImage: unmap}
	defer func() {
		if err != nil {
			unmap()
		}
	}()
	if boot.IsELF(image) {
		v, err := boot.ParseVmlinux(image)
		if err != nil {
			return nil, fieldErr("Kernel", "%s: %v", cfg.Kernel, err)
		}
		ki.check = boot.KernelFromVmlinux(v)
		ki.boot = ki.check
		close(ki.done)
		vm.log.Info("kernel", "path", cfg.Kernel, "format", "vmlinux (ELF)", "entry", fmt.Sprintf("%#x", v.Entry))
		return ki, nil
	}
	bz, err := boot.ParseBzImage(image)
	if err != nil {
		return nil, fieldErr("Kernel", "%s: %v", cfg.Kernel, err)
	}
	ki.check = bz
	if cfg.KernelDecompress == DecompressGuest {
		ki.boot = bz
		close(ki.done)
		vm.log.Info("kernel", "path", cfg.Kernel, "version", bz.Version, "decompress", "guest")
		return ki, nil
	}
	cache, err := vmlinux.OpenCache(cfg.KernelCache, cfg.KernelCacheMax)
	if err != nil {
		return nil, fieldErr("KernelCache", "%v", err)
	}
	// The decompression takes seconds and writes the cache: a host whose
	// KVM cannot run the guest refuses before it, once the input (the
	// image, the cache directory) has been checked.
	if err := checkKVMFirst(cfg); err != nil {
		return nil, err
	}
	go ki.prepare(vm, cache, bz, image, info)
	return ki, nil
}

// kernelKeyed, when set (tests), runs between the cache key's hash and the
// lookup or decompression: the window a user who can write the kernel file
// would race.
var kernelKeyed func()

// prepare finds the vmlinux for bz (parsed from image, the file info) in
// the cache, or decompresses and caches it, and parses it for Load. A cache entry that fails its checks
// is logged and replaced; a cache that cannot be written only costs the
// next launch a decompression.
func (ki *kernelImage) prepare(vm *VM, cache *vmlinux.Cache, bz *boot.Kernel, image []byte, info os.FileInfo) {
	defer close(ki.done)
	start := time.Now()
	// The key's SHA-256 of the bzImage runs here too, off New's path, or
	// is the one recorded for this very file.
	key, hashed := cache.KeyFor(image, info)
	vm.log.Debug("kernel cache key", "sha256_of_bzimage", key.String(), "hashed", hashed, "in", time.Since(start).Round(time.Millisecond))
	if kernelKeyed != nil {
		kernelKeyed()
	}
	path := cache.Path(key)
	var data []byte
	e, err := cache.Get(key)
	hit := err == nil
	lookup := time.Since(start)
	var format vmlinux.Format
	if hit {
		ki.entry, data = e, e.Bytes()
	} else {
		ki.decompressed = true
		if err != vmlinux.ErrMiss {
			vm.log.Warn("kernel cache entry unusable; decompressing again", "err", err)
		}
		if data, format, err = vmlinux.Decompress(bz); err != nil {
			ki.err = fieldErr("Kernel", "%s: %v", vm.cfg.Kernel, err)
			return
		}
		if err := cache.Put(key, data); err != nil {
			vm.log.Warn("kernel cache not written; the next launch decompresses again", "err", err)
		}
	}
	v, err := boot.ParseVmlinux(data)
	if err != nil {
		ki.err = fieldErr("Kernel", "%s: decompressed kernel: %v", vm.cfg.Kernel, err)
		return
	}
	k := *bz
	k.ELF = v
	ki.boot = &k
	attrs := []any{"path", vm.cfg.Kernel, "version", bz.Version, "decompress", "host", "cache", path,
		"entry", fmt.Sprintf("%#x", v.Entry), "vmlinux_bytes", len(data), "elapsed", time.Since(start).Round(time.Millisecond),
		"cache_read", lookup.Round(time.Millisecond)}
	if hit {
		// sha256_verified: the content hashed now, or the record of an
		// earlier hash of this unchanged file trusted (vmlinux/identity.go).
		verified := "recorded"
		if ki.entry.Hashed() {
			verified = "now"
		}
		attrs = append(attrs, "cache_hit", true, "sha256_verified", verified)
	} else {
		attrs = append(attrs, "cache_hit", false, "format", format)
	}
	vm.log.Info("kernel", attrs...)
}

// wait returns the kernel to load once openKernel's background work is
// done.
func (ki *kernelImage) wait() (*boot.Kernel, error) {
	<-ki.done
	return ki.boot, ki.err
}

// release waits for the background work and gives back what held the
// vmlinux once it is in guest RAM (or New failed): the cache file's
// mapping, or the decompressed copy on the heap, 40-80 MiB that would
// otherwise stay in hpcvmm's resident memory until the runtime returned
// it on its own. Call it after boot.Load; the kernel's segments are
// invalid afterwards.
func (ki *kernelImage) release() {
	<-ki.done
	ki.boot = nil
	if ki.unmapImage != nil {
		ki.unmapImage()
		ki.unmapImage = nil
	}
	if ki.entry != nil {
		_ = ki.entry.Close()
		ki.entry = nil
	}
	if ki.decompressed {
		debug.FreeOSMemory()
	}
}
