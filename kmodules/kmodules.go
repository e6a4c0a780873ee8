// Package kmodules picks the kernel modules a job's guest needs and reads
// them for its initramfs: virtio_pci, virtio_console and virtio_net (the
// devices every hpcvmm guest has) and the driver of each passed-through
// device, found by matching the device's modalias (sysfs) against
// modules.alias as modprobe would, each with its dependencies from
// modules.dep, dependencies first, no duplicates. Modules built into the
// kernel (modules.builtin) need no loading and are skipped.
//
// The modules come from the job image's /lib/modules/RELEASE when it has
// one (a rootfs built for the kernel), else from the host's (an HPC node
// boots the guest with its own kernel, whose GPU and InfiniBand drivers
// are built for it). The text files are parsed, not the .bin indexes:
// their format is kmod's internal one. Compressed modules (.ko.xz, .ko.zst,
// .ko.gz) are decompressed on the host, so the guest needs neither
// in-kernel module decompression nor a decompressor: xz with
// github.com/therootcompany/xz, zstd and gzip with
// github.com/klauspost/compress (both already hpcvmm dependencies, see
// package vmlinux).
//
// Each module's .modinfo names the firmware it may request (ParseModinfo,
// Set.Firmware: names from an image's module are untrusted and checked,
// ValidFirmwareName); FindFirmware looks the files up on the host as the
// kernel's firmware loader would (firmware.go), for the initramfs to carry
// them to the guest's /lib/firmware.
package kmodules

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/therootcompany/xz"
)

// DefaultModules are the drivers of the devices every hpcvmm guest has.
var DefaultModules = []string{"virtio_pci", "virtio_console", "virtio_net"}

// DefaultHostDir is where the host keeps its kernels' modules.
const DefaultHostDir = "/lib/modules"

// Bounds on what is read: modules.alias of a distribution kernel is
// about 1.5 MiB, its largest module (a GPU driver) under 100 MiB.
const (
	maxIndexBytes  = 64 << 20
	maxModuleBytes = 512 << 20
)

// Files reads files of the job's image; *rootfs.Image implements it
// (names are paths inside the image, symlinks resolved inside it; files
// that do not exist are absent from the map).
type Files interface {
	ReadFiles(names []string, maxEach int64) (map[string][]byte, error)
}

// Config says which modules Resolve picks.
type Config struct {
	// Release is the guest kernel's release (boot.Kernel.Release), the
	// name of its /lib/modules directory.
	Release string
	// Image is the job's image, looked in first; nil for the host only.
	Image Files
	// HostDir is the host's modules root ("": DefaultHostDir).
	HostDir string
	// Modules are module names to load ("-" and "_" are the same); nil
	// means DefaultModules.
	Modules []string
	// Modaliases are the modalias strings of passed-through devices
	// (PCIModalias); each brings every module whose alias matches it.
	Modaliases []string
	// Optional are module names loaded, with their dependencies, where
	// the kernel has them and skipped where it has not (Set.Absent): a
	// GPU driver's nvidia_modeset, which not every driver build has.
	Optional []string
	// Exclude are module names a modalias never brings (nouveau, whose
	// aliases match the GPUs the nvidia driver is loaded for); the device
	// still counts as matched.
	Exclude []string
}

// UnknownModuleError is a module asked for by name (Config.Modules) that
// the kernel has neither as a module nor built in.
type UnknownModuleError struct {
	// Name is the module (normalized), Release the kernel's release and
	// Where the modules directory looked in.
	Name, Release, Where string
}

func (e *UnknownModuleError) Error() string {
	return fmt.Sprintf("kmodules: module %s is neither in %s/modules.dep nor built into kernel %s: use a kernel that has it", e.Name, e.Where, e.Release)
}

// Module is one module to load.
type Module struct {
	// Name is the module's name, with underscores (as lsmod shows it).
	Name string
	// Path is where the guest finds the decompressed module, relative to
	// /lib/modules/RELEASE: modules.dep's path less any compression
	// suffix (kernel/drivers/net/virtio_net.ko).
	Path string
	// Data is the module's ELF object, decompressed.
	Data []byte
	// File is the module's file as modules.dep names it (with any
	// compression suffix), relative to the modules directory, and
	// FileSHA256 the SHA-256 of the bytes read from it: for modules from
	// the image, package initramfs checks them against the file its walk
	// of the image saw.
	File       string
	FileSHA256 [sha256.Size]byte
	// Firmware are the firmware files the module names (ModInfo's) and
	// Version its version= record, from its .modinfo; ModinfoErr says why
	// they are unknown when its object has no .modinfo debug/elf reads
	// (the guest kernel refuses such an object anyway).
	Firmware   []string
	Version    string
	ModinfoErr error
}

// Set is the modules a guest loads, in load order.
type Set struct {
	// Release is the kernel release the modules are for.
	Release string
	// Source is the directory they came from ("IMAGE:/lib/modules/R" or
	// the host's), empty when neither the image nor the host has one: a
	// kernel with the drivers built in needs none, and with any other a
	// missing driver shows in the guest (the agent reports a missing
	// port).
	Source string
	// Modules are the modules to load, dependencies before dependents.
	Modules []Module
	// Builtin are requested modules the kernel has built in.
	Builtin []string
	// Unmatched are the modaliases no module (loadable or built in)
	// claims: such a device has no driver in the guest kernel.
	Unmatched []string
	// Absent are the Config.Optional modules the kernel lacks.
	Absent []string
}

// index is a modules directory's text indexes.
type index struct {
	deps    map[string][]string // module name → modules.dep paths of its dependencies
	paths   map[string]string   // module name → its modules.dep path
	aliases [][2]string         // (pattern, module name), modules.alias order
	builtin map[string]bool     // module names built in
	bAlias  [][2]string         // built-in modules' aliases (modules.builtin.modinfo)
}

// nameOf is the module name of a modules.dep path.
func nameOf(p string) string {
	b := path.Base(p)
	for _, suf := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, suf)
	}
	return Normalize(strings.TrimSuffix(b, ".ko"))
}

// Resolve picks the modules cfg asks for and reads them.
func Resolve(cfg Config) (*Set, error) {
	if err := ValidateRelease(cfg.Release); err != nil {
		return nil, fmt.Errorf("kmodules: %w", err)
	}
	hostDir := cfg.HostDir
	if hostDir == "" {
		hostDir = DefaultHostDir
	}
	want := cfg.Modules
	if want == nil {
		want = DefaultModules
	}
	src, err := openSource(cfg.Image, hostDir, cfg.Release)
	if err != nil {
		return nil, err
	}
	set := &Set{Release: cfg.Release}
	if src == nil {
		set.Unmatched = append(set.Unmatched, cfg.Modaliases...)
		for _, m := range cfg.Optional {
			set.Absent = append(set.Absent, Normalize(m))
		}
		return set, nil
	}
	set.Source = src.where
	ix := src.ix

	var names []string
	for i, m := range append(slices.Clone(want), cfg.Optional...) {
		n := Normalize(m)
		switch {
		case slicesContains(names, n) || slicesContains(set.Builtin, n):
		case ix.paths[n] != "":
			names = append(names, n)
		case ix.builtin[n]:
			set.Builtin = append(set.Builtin, n)
		case i >= len(want):
			set.Absent = append(set.Absent, n)
		default:
			return nil, &UnknownModuleError{Name: n, Release: cfg.Release, Where: src.where}
		}
	}
	excluded := map[string]bool{}
	for _, m := range cfg.Exclude {
		excluded[Normalize(m)] = true
	}
	for _, alias := range cfg.Modaliases {
		matched := false
		for _, a := range ix.aliases {
			if Match(a[0], alias) {
				matched = true
				if ix.paths[a[1]] != "" && !excluded[a[1]] && !slicesContains(names, a[1]) {
					names = append(names, a[1])
				}
			}
		}
		for _, a := range ix.bAlias {
			if Match(a[0], alias) {
				matched = true
				if !slicesContains(set.Builtin, a[1]) {
					set.Builtin = append(set.Builtin, a[1])
				}
			}
		}
		if !matched {
			set.Unmatched = append(set.Unmatched, alias)
		}
	}

	order, err := ix.loadOrder(names)
	if err != nil {
		return nil, fmt.Errorf("kmodules: %s: %w", src.where, err)
	}
	datas, err := src.read(order)
	if err != nil {
		return nil, err
	}
	for _, p := range order {
		data, err := decompress(p, datas[p])
		if err != nil {
			return nil, fmt.Errorf("kmodules: %s/%s: %w: the module file is corrupt; reinstall the kernel's modules", src.where, p, err)
		}
		// A firmware name is checked here, where the module is named: its
		// lookup on the host comes later (FindFirmware).
		info, ierr := ParseModinfo(data)
		var fe *FirmwareNameError
		if errors.As(ierr, &fe) {
			fe.Module = nameOf(p)
			return nil, fe
		}
		set.Modules = append(set.Modules, Module{Name: nameOf(p), Path: stripCompression(p), Data: data, File: p, FileSHA256: sha256.Sum256(datas[p]),
			Firmware: info.Firmware, Version: info.Version, ModinfoErr: ierr})
	}
	return set, nil
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func stripCompression(p string) string {
	for _, suf := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(p, ".ko"+suf) {
			return strings.TrimSuffix(p, suf)
		}
	}
	return p
}

// loadOrder returns the modules.dep paths of names and their dependencies,
// each after everything it depends on, each once.
func (ix *index) loadOrder(names []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(p string, depth int) error
	visit = func(p string, depth int) error {
		switch state[p] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("modules.dep has a dependency cycle through %s", p)
		}
		if depth > 64 {
			return fmt.Errorf("modules.dep dependencies nest deeper than 64 at %s", p)
		}
		state[p] = 1
		for _, d := range ix.deps[nameOf(p)] {
			if ix.paths[nameOf(d)] == "" {
				return fmt.Errorf("modules.dep: %s depends on %s, which it does not list", p, d)
			}
			if err := visit(ix.paths[nameOf(d)], depth+1); err != nil {
				return err
			}
		}
		state[p] = 2
		order = append(order, p)
		return nil
	}
	for _, n := range names {
		if err := visit(ix.paths[n], 0); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// source is a modules directory: the image's or the host's.
type source struct {
	where string
	ix    *index
	read  func(paths []string) (map[string][]byte, error)
}

// openSource finds /lib/modules/RELEASE in the image, else on the host,
// and parses its indexes; nil when neither has modules.dep.
func openSource(img Files, hostDir, release string) (*source, error) {
	indexFiles := []string{"modules.dep", "modules.alias", "modules.builtin", "modules.builtin.modinfo"}
	if img != nil {
		dir := "/lib/modules/" + release
		var names []string
		for _, f := range indexFiles {
			names = append(names, dir+"/"+f)
		}
		got, err := img.ReadFiles(names, maxIndexBytes)
		if err != nil {
			return nil, fmt.Errorf("kmodules: %w", err)
		}
		if dep, ok := got[names[0]]; ok {
			where := "image:" + dir
			ix, err := parseIndex(dep, got[names[1]], got[names[2]], got[names[3]])
			if err != nil {
				return nil, fmt.Errorf("kmodules: %s: %w", where, err)
			}
			return &source{where: where, ix: ix, read: func(paths []string) (map[string][]byte, error) {
				var full []string
				for _, p := range paths {
					full = append(full, dir+"/"+p)
				}
				got, err := img.ReadFiles(full, maxModuleBytes)
				if err != nil {
					return nil, fmt.Errorf("kmodules: %w", err)
				}
				out := map[string][]byte{}
				for i, p := range paths {
					b, ok := got[full[i]]
					if !ok {
						return nil, fmt.Errorf("kmodules: %s/%s is listed in modules.dep but missing from the image: rebuild the image's module indexes (depmod)", where, p)
					}
					out[p] = b
				}
				return out, nil
			}}, nil
		}
	}
	dir := filepath.Join(hostDir, release)
	var bufs [4][]byte
	for i, f := range indexFiles {
		b, err := readBounded(filepath.Join(dir, f), maxIndexBytes)
		if errors.Is(err, fs.ErrNotExist) && i > 0 {
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kmodules: %w", err)
		}
		bufs[i] = b
	}
	ix, err := parseIndex(bufs[0], bufs[1], bufs[2], bufs[3])
	if err != nil {
		return nil, fmt.Errorf("kmodules: %s: %w", dir, err)
	}
	return &source{where: dir, ix: ix, read: func(paths []string) (map[string][]byte, error) {
		out := map[string][]byte{}
		for _, p := range paths {
			b, err := readBounded(filepath.Join(dir, filepath.FromSlash(p)), maxModuleBytes)
			if err != nil {
				return nil, fmt.Errorf("kmodules: %w: reinstall the kernel's modules or run depmod %s", err, release)
			}
			out[p] = b
		}
		return out, nil
	}}, nil
}

func readBounded(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, limit)
	}
	return b, nil
}

// parseIndex parses modules.dep, modules.alias, modules.builtin and
// modules.builtin.modinfo (the last three may be nil).
func parseIndex(dep, alias, builtin, modinfo []byte) (*index, error) {
	ix := &index{deps: map[string][]string{}, paths: map[string]string{}, builtin: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(dep))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		p, rest, ok := strings.Cut(l, ":")
		if !ok || !validModPath(p) {
			return nil, fmt.Errorf("modules.dep line %d: %q is not \"path: deps\" with a relative .ko path: regenerate it with depmod", line, l)
		}
		n := nameOf(p)
		ix.paths[n] = p
		var ds []string
		for _, d := range strings.Fields(rest) {
			if !validModPath(d) {
				return nil, fmt.Errorf("modules.dep line %d: dependency %q is not a relative .ko path: regenerate it with depmod", line, d)
			}
			ds = append(ds, d)
		}
		ix.deps[n] = ds
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	sc = bufio.NewScanner(bytes.NewReader(alias))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "alias" {
			ix.aliases = append(ix.aliases, [2]string{f[1], Normalize(f[2])})
		}
	}
	for _, l := range strings.Split(string(builtin), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			ix.builtin[nameOf(l)] = true
		}
	}
	for _, rec := range bytes.Split(modinfo, []byte{0}) {
		k, v, ok := strings.Cut(string(rec), "=")
		if mod, field, ok2 := strings.Cut(k, "."); ok && ok2 && field == "alias" {
			ix.bAlias = append(ix.bAlias, [2]string{v, Normalize(mod)})
			ix.builtin[Normalize(mod)] = true
		}
	}
	return ix, nil
}

// validModPath accepts a modules.dep path: relative, clean, a .ko file.
func validModPath(p string) bool {
	return p != "" && !strings.HasPrefix(p, "/") && path.Clean(p) == p && !strings.HasPrefix(p, "../") &&
		strings.HasSuffix(stripCompression(p), ".ko")
}

// decompress returns a module's object by its file name's suffix.
func decompress(p string, b []byte) ([]byte, error) {
	var r io.Reader
	switch {
	case strings.HasSuffix(p, ".ko"):
		r = bytes.NewReader(b)
	case strings.HasSuffix(p, ".xz"):
		zr, err := xz.NewReader(bytes.NewReader(b), 0)
		if err != nil {
			return nil, err
		}
		r = zr
	case strings.HasSuffix(p, ".zst"):
		zr, err := zstd.NewReader(bytes.NewReader(b), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxModuleBytes))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	case strings.HasSuffix(p, ".gz"):
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		r = zr
	default:
		return nil, fmt.Errorf("unknown module suffix")
	}
	out, err := io.ReadAll(io.LimitReader(r, maxModuleBytes+1))
	if err != nil {
		return nil, err
	}
	if len(out) > maxModuleBytes {
		return nil, fmt.Errorf("decompresses to more than %d bytes", maxModuleBytes)
	}
	if !bytes.HasPrefix(out, []byte("\x7fELF")) {
		return nil, fmt.Errorf("decompressed, it is not an ELF object")
	}
	return out, nil
}

// PCIModalias returns the modalias of PCI device bdf (e.g. 0000:3b:00.0)
// from sysfs ("" means /sys): the string modules.alias patterns match.
func PCIModalias(sysfs, bdf string) (string, error) {
	if sysfs == "" {
		sysfs = "/sys"
	}
	if strings.ContainsAny(bdf, "/") || bdf == "" || bdf == "." || bdf == ".." {
		return "", fmt.Errorf("kmodules: %q is not a PCI address", bdf)
	}
	b, err := readBounded(filepath.Join(sysfs, "bus/pci/devices", bdf, "modalias"), 4096)
	if err != nil {
		return "", fmt.Errorf("kmodules: modalias of %s: %w", bdf, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// HostState identifies the host's modules for kernel release: the
// identity (device, inode, size, modification and status-change times) of
// its modules.dep, which depmod rewrites (by rename, so a new inode)
// whenever modules are installed, rebuilt or removed. A cache keyed by it
// is rebuilt after such a change without reading the modules. "none"
// when the host has no modules for release.
func HostState(hostDir, release string) string {
	if hostDir == "" {
		hostDir = DefaultHostDir
	}
	if ValidateRelease(release) != nil {
		return "none" // Resolve refuses it
	}
	fi, err := os.Stat(filepath.Join(hostDir, release, "modules.dep"))
	if err != nil {
		return "none"
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprintf("size %d mtime %d", fi.Size(), fi.ModTime().UnixNano())
	}
	return fmt.Sprintf("dev %d ino %d size %d mtime %d ctime %d", st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano())
}

// Names returns the modules' names in load order (for logs).
func (s *Set) Names() []string {
	var out []string
	for _, m := range s.Modules {
		out = append(out, m.Name)
	}
	return out
}

// Bytes is the modules' total decompressed size.
func (s *Set) Bytes() int64 {
	var n int64
	for _, m := range s.Modules {
		n += int64(len(m.Data))
	}
	return n
}
