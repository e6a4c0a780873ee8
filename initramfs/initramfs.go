// Package initramfs builds the initramfs a job's guest boots (hpcvmm run
// --rootfs IMAGE -- COMMAND): a newc archive, written with u-root's
// pkg/cpio as the project's test images are, holding
//
//   - IMAGE's flattened tree (package rootfs), owners and modes as IMAGE
//     has them, every time stamp 0 (archives are reproducible: the same
//     inputs give the same bytes);
//   - the guest agent at AgentPath: hpcvmm's own binary, or a program that
//     calls jobrun.Dispatch first (jobrun passes Request.Agent, which
//     jobrun.CheckAgent has asked), which must be static, since IMAGE's
//     libc (if any) is not hpcvmm's; the kernel starts it with rdinit=;
//   - the kernel modules the guest needs (package kmodules) under
//     /lib/modules/RELEASE/..., and ModulesList naming them in load order;
//   - the firmware those modules name that the host has (an NVIDIA GPU's
//     GSP firmware), under /lib/firmware (firmware.go);
//   - the directories the agent mounts on (/proc, /sys, /dev, /tmp, /run)
//     and /dev/console, where IMAGE lacks them.
//
// A hard link in IMAGE becomes a copy of its target (the archive is
// written in one pass, and newc's hard links need every link of a file
// marked before the first one's content), so the guest sees two equal
// files. Entries of IMAGE under /.hpcvmm are left out: that directory is
// hpcvmm's.
//
// Built archives are cached (cache.go): the key is a hash of IMAGE's key,
// the agent's SHA-256, the kernel release, the modules (to load, optional
// and excluded) and modaliases asked for, the host modules directory's state, the
// firmware's directories, files (by SHA-256) and missing names, and the archive format's
// version, so a warm launch of an unchanged IMAGE builds nothing; for a tar
// or container IMAGE and the agent it hashes nothing either (identity
// records), for a directory IMAGE it reads the tree once (rootfs.Image.Key).
package initramfs

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"

	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// Defaults and fixed paths in the guest.
const (
	// DefaultCacheDir is where root's built archives are kept unless told
	// otherwise; every other user has a cache of their own
	// (cachedir.Default, which OpenCache uses for "").
	DefaultCacheDir = "/var/cache/hpcvmm/initramfs"
	// DefaultCacheMax bounds the cache: a few large job images.
	DefaultCacheMax = 16 << 30
	// AgentPath is where the agent lies in the guest (rdinit=AgentPath).
	AgentPath = "/.hpcvmm/hpcvmm-agent"
	// ModulesList is the file listing the modules' guest paths, one per
	// line, in load order.
	ModulesList = "/.hpcvmm/modules"
	// formatVersion changes whenever Build would write other bytes for the
	// same inputs, so older cache entries are never served.
	formatVersion = "hpcvmm-initramfs-format v3"
)

// Config is what Build builds from.
type Config struct {
	// Image is the job's root file system.
	Image *rootfs.Image
	// Agent is the agent's binary, statically linked: hpcvmm's own
	// (os.Executable()) or a program that calls jobrun.Dispatch first
	// (package jobrun checks that before it builds).
	Agent string
	// Release is the guest kernel's release (boot.Kernel.Release).
	Release string
	// HostModules is the host's modules root ("": /lib/modules).
	HostModules string
	// Modules are the module names to load (nil: kmodules.DefaultModules).
	Modules []string
	// Modaliases are the passed-through devices' modaliases
	// (kmodules.PCIModalias).
	Modaliases []string
	// Optional are modules loaded where the guest kernel has them and
	// Exclude modules never loaded, as kmodules.Config's (an NVIDIA
	// GPU's nvidia_modeset and nouveau: gpudriver.ForModaliases). Both
	// are part of the cache key: another module set is another archive.
	Optional, Exclude []string
	// HostFirmware are the host's firmware directories, searched in order
	// for the firmware the modules name (nil: kmodules.FirmwareDirs of
	// the host for Release). RequireFirmware are patterns
	// (kmodules.Match) of firmware names that must be found when a module
	// names them, else the build is refused with a
	// *kmodules.MissingFirmwareError (gpudriver.Modules.RequireFirmware:
	// an NVIDIA GPU's GSP firmware); any other file missing is logged to
	// Log (nil: slog.Default()) and left out. Both are part of the key.
	HostFirmware, RequireFirmware []string
	Log                           *slog.Logger
	// CacheDir is the cache directory ("": the user's own,
	// cachedir.Default), CacheMax its
	// bound in bytes (0: DefaultCacheMax).
	CacheDir string
	CacheMax int64
	// GuestMemory is the guest's RAM in bytes; when positive, an IMAGE
	// that does not fit unpacked (Fits) is refused, during the build as
	// soon as it is known, and on a cache hit from the recorded sizes.
	GuestMemory int64
}

// Result is a built (or cached) initramfs. After Build, Config.Image's
// lookups (LookPath, Usage) read nothing of an archive or container IMAGE:
// its index came from the build's walk or, on a hit, from the cache.
type Result struct {
	// Path is the archive in the cache: the initrd to boot
	// (vmm.Config.Initrd). Entries used in the last 10 minutes are never
	// evicted, so it stays until the VM has mapped it.
	Path string
	// Hit reports a cache hit: nothing was built.
	Hit bool
	// Key is the cache key (hex).
	Key string
	// Size is the archive's size, Unpacked what its tree takes unpacked in
	// the guest's tmpfs (rootfs.Usage's Memory rule).
	Size, Unpacked int64
	// Modules are the modules the agent loads, in order; ModuleSource the
	// directory they came from ("" when none was found: see
	// kmodules.Set.Source); Unmatched the modaliases no module claims.
	Modules      []string
	ModuleSource string
	Unmatched    []string
	// Firmware are the firmware files the archive carries, as paths below
	// the guest's /lib/firmware; MissingFirmware those the modules name
	// that the host does not have.
	Firmware        []string
	MissingFirmware []kmodules.MissingFirmware
	// Replaced says why a cache entry for the key was unusable and rebuilt
	// ("" when there was none or it was used), for the log.
	Replaced string
}

// CheckAgent refuses an agent binary that is not a static ELF executable:
// the guest has IMAGE's libraries, not the host's.
func CheckAgent(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("initramfs: agent %s: %w: pass hpcvmm's own binary", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("hpcvmm at %s is dynamically linked; rebuild it with CGO_ENABLED=0", p)
		}
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("initramfs: agent %s is an ELF %v, not an executable", p, f.Type)
	}
	return nil
}

// Build returns the initramfs for cfg: from the cache when it holds a
// valid entry for cfg's key, else built, stored and returned. Nothing
// outside the cache directory is written; a build that fails leaves no
// entry behind in it (the record of the firmware its modules name may
// stay: it holds for the key whatever failed).
func Build(cfg Config) (*Result, error) {
	e, err := lookup(cfg, true)
	if err != nil {
		return nil, err
	}
	e.fw.logMissing(cfg.log())
	if e.m != nil {
		return e.res, nil
	}
	m, err := build(cfg, e)
	if err != nil {
		forgetChanged(cfg, e.cache, err)
		return nil, err
	}
	e.res.fill(m)
	return e.res, nil
}

// forgetChanged forgets the hash records of IMAGE and the agent after err
// found a file other than its record said: the records chose a key the
// files do not match, so the next launch hashes them again rather than
// failing the same way.
func forgetChanged(cfg Config, cache *Cache, err error) {
	if strings.Contains(err.Error(), "changed while hpcvmm read it") {
		cache.Forget(cfg.Image.Path())
		cache.Forget(cfg.Agent)
	}
}

// Lookup is Build without building: the cached initramfs for cfg, or nil
// (and no error) when the cache holds no usable entry. On a hit,
// Config.Image's lookups (LookPath, Usage) read nothing of an archive or
// container IMAGE from then on, so a caller that checks COMMAND before
// building calls Lookup first: a warm launch then reads nothing of IMAGE
// at all, and Build afterwards finds the same entry (its hashes are
// remembered: milliseconds).
func Lookup(cfg Config) (*Result, error) {
	e, err := lookup(cfg, false)
	if err != nil || e.m == nil {
		return nil, err
	}
	e.fw.logMissing(cfg.log())
	return e.res, nil
}

// entry is what lookup found for a Config.
type entry struct {
	res      *Result
	cache    *Cache
	agentSum string
	base     string        // the key less the firmware (cacheKey)
	m        *meta         // nil on a miss
	fw       *fwPlan       // nil only on Lookup's miss without a firmware record
	set      *kmodules.Set // the modules, when lookup resolved them
}

// lookup computes cfg's key and returns the cache's entry for it (m nil
// on a miss; res.Replaced says why an entry was unusable). The key needs
// the firmware the modules name: from the record of an earlier build,
// else, with resolve, by resolving the modules (handed on to build);
// without resolve a missing record is a miss, since no entry was built.
func lookup(cfg Config, resolve bool) (*entry, error) {
	if cfg.Image == nil {
		return nil, errors.New("initramfs: Config.Image is nil: open the image with rootfs.Open")
	}
	if cfg.Agent == "" || cfg.Release == "" {
		return nil, errors.New("initramfs: Config.Agent and Config.Release are required: pass os.Executable() and the kernel's release")
	}
	if err := CheckAgent(cfg.Agent); err != nil {
		return nil, err
	}
	cache, err := OpenCache(cfg.CacheDir, cfg.CacheMax)
	if err != nil {
		return nil, err
	}
	e := &entry{cache: cache}
	if e.base, e.agentSum, err = cacheKey(cfg, cache); err != nil {
		return nil, err
	}
	refs, ok := cache.readRefs(e.base)
	if !ok {
		if !resolve {
			return e, nil
		}
		if e.set, err = kmodules.Resolve(cfg.modules(cfg.Image)); err != nil {
			forgetChanged(cfg, cache, err) // IMAGE's modules are read against its key
			return nil, err
		}
		refs = e.set.Firmware()
		cache.writeRefs(e.base, refs)
	}
	if e.fw, err = planFirmware(cfg, cache, refs); err != nil {
		return nil, err
	}
	key := e.fw.key(e.base)
	res := &Result{Key: key, Path: cache.archivePath(key)}
	e.res = res
	e.fw.fill(res)
	m, index, _, err := cache.get(key)
	if err == nil && index != nil {
		if lerr := cfg.Image.LoadIndex(bytes.NewReader(index)); lerr != nil {
			err = fmt.Errorf("initramfs: cache index of %s: %w", key, lerr)
		}
	}
	switch {
	case err == nil:
		res.Hit = true
		res.fill(m)
		if cfg.GuestMemory > 0 {
			if err := Fits(m.size, m.unpacked, cfg.GuestMemory); err != nil {
				return nil, fmt.Errorf("initramfs: image %s %w", cfg.Image.Path(), err)
			}
		}
		e.m = m
	case !errors.Is(err, errMiss):
		res.Replaced = err.Error()
	}
	return e, nil
}

func (r *Result) fill(m *meta) {
	r.Size, r.Unpacked = m.size, m.unpacked
	r.Modules, r.Unmatched, r.ModuleSource = m.modules, m.unmatched, m.source
}

// modules is what cfg asks of package kmodules, with im as the image.
func (cfg Config) modules(im kmodules.Files) kmodules.Config {
	return kmodules.Config{Release: cfg.Release, Image: im, HostDir: cfg.HostModules, Modules: cfg.Modules,
		Modaliases: cfg.Modaliases, Optional: cfg.Optional, Exclude: cfg.Exclude}
}

// build writes the archive for cfg into the cache under e's key.
func build(cfg Config, e *entry) (m *meta, err error) {
	im, cache, key, agentSum := cfg.Image, e.cache, e.res.Key, e.agentSum
	set := e.set
	if set == nil {
		if set, err = kmodules.Resolve(cfg.modules(im)); err != nil {
			return nil, err
		}
		if !e.fw.sameRefs(set.Firmware()) {
			// A module replaced without depmod: the record is stale.
			_ = os.Remove(cache.refsPath(e.base))
			return nil, fmt.Errorf("initramfs: the modules for kernel %s name other firmware than when hpcvmm last read them (changed while hpcvmm read it): launch again", cfg.Release)
		}
	}
	f, err := cache.CreateTemp(key)
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			_ = f.Close()
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	sum := sha256.New()
	a := newArchive(f)
	a.cnt.w = io.MultiWriter(a.buf, sum)
	bound, why := cache.EntryBound()
	a.cnt.limit, a.cnt.over = bound, func() error { return boundError(cfg.Image.Path(), "", bound, why) }
	b := &builder{a: a, cfg: cfg, top: map[string]string{}, agentSum: agentSum, bound: bound, boundWhy: why,
		modFiles: map[string]bool{}, modSums: map[string][sha256.Size]byte{}, fw: e.fw, cache: cache}
	if strings.HasPrefix(set.Source, "image:") {
		for _, m := range set.Modules {
			b.modFiles[path.Base(m.File)] = true
		}
	}
	if err := im.WalkKeyed(b.entry); err != nil {
		return nil, err
	}
	if err := b.extras(set); err != nil {
		return nil, err
	}
	if err := a.close(); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("initramfs: cache: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("initramfs: cache: close %s: %w", tmp, err)
	}
	f = nil
	m = &meta{sum: hex.EncodeToString(sum.Sum(nil)), size: a.size(), unpacked: b.unpacked,
		modules: set.Names(), unmatched: set.Unmatched, source: set.Source}
	var index []byte
	if im.Format() != rootfs.FormatDir {
		var ib bytes.Buffer
		if err := im.SaveIndex(&ib); err != nil {
			return nil, err
		}
		index = ib.Bytes()
	}
	if err := cache.put(key, tmp, m, index); err != nil {
		return nil, err
	}
	return m, nil
}

// builder turns rootfs entries into archive records.
type builder struct {
	a        *archive
	cfg      Config
	unpacked int64
	top      map[string]string // top-level symlinks of the image → targets
	agentSum string            // the key's SHA-256 of the agent, hex
	// The base names of the image's module files, and the SHA-256 of each
	// file of such a name the walk wrote (modules from the image only).
	modFiles map[string]bool
	modSums  map[string][sha256.Size]byte
	// bound is the most bytes the archive may take (filecache.Cache.EntryBound),
	// boundWhy what sets it.
	bound    int64
	boundWhy string
	// fw is the firmware to write, cache the cache whose records its
	// hashes came from.
	fw    *fwPlan
	cache *Cache
}

// boundError is the refusal of an archive that would grow past bound.
func boundError(image, name string, bound int64, why string) error {
	at := ""
	if name != "" {
		at = fmt.Sprintf(" at /%s", name[:min(len(name), 64)])
	}
	return fmt.Errorf("initramfs: image %s: its initramfs grows past %d MiB%s, %s: use a smaller image, or make room for the cache", image, mib(bound), at, why)
}

// count adds an entry called name of size content bytes to the unpacked
// total and, before it is written, checks the archive stays within its
// bound (the cache's size bound and free space: issue 30 item 4) and the
// image still fits the guest (Fits) with the entry in the archive too: a
// build that cannot boot, or would fill the disk, stops before it writes
// the file that makes it too large.
func (b *builder) count(name string, size int64) error {
	if b.a.size()+rootfs.NewcSize(name, size) > b.bound {
		return boundError(b.cfg.Image.Path(), name, b.bound, b.boundWhy)
	}
	b.unpacked += rootfs.EntryOverhead + (size+rootfs.PageSize-1)/rootfs.PageSize*rootfs.PageSize
	if b.cfg.GuestMemory > 0 {
		if err := Fits(b.a.size()+size+512, b.unpacked, b.cfg.GuestMemory); err != nil {
			return fmt.Errorf("initramfs: image %s %w", b.cfg.Image.Path(), err)
		}
	}
	return nil
}

func (b *builder) entry(e *rootfs.Entry, content io.Reader) error {
	if e.Name == ".hpcvmm" || strings.HasPrefix(e.Name, ".hpcvmm/") {
		return nil
	}
	a := b.a
	size := int64(0)
	switch {
	case e.Hardlink:
		size = a.data[e.Link][1]
	case e.Mode.IsRegular():
		size = e.Size
	}
	if err := b.count(e.Name, size); err != nil {
		return err
	}
	var err error
	switch {
	case e.IsDir():
		err = a.dir(e.Name, e.Mode, e.UID, e.GID)
	case e.Mode&fs.ModeSymlink != 0:
		if !strings.Contains(e.Name, "/") {
			b.top[e.Name] = e.Link
		}
		err = a.symlink(e.Name, e.Link, e.UID, e.GID)
	case e.Hardlink:
		err = a.copyOf(e.Name, e.Link, e.Mode.Perm()|e.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), e.UID, e.GID)
	case e.Mode.IsRegular():
		if b.modFiles[path.Base(e.Name)] && strings.Contains(e.Name, "/modules/"+b.cfg.Release+"/") {
			// Perhaps one of the image's modules: remember what the walk
			// saw of it, to check the copy kmodules read (extras).
			h := sha256.New()
			err = a.file(e.Name, e.Mode, e.UID, e.GID, e.Size, io.TeeReader(content, h))
			var sum [sha256.Size]byte
			b.modSums[e.Name] = [sha256.Size]byte(h.Sum(sum[:0]))
		} else {
			err = a.file(e.Name, e.Mode, e.UID, e.GID, e.Size, content)
		}
	default:
		err = a.node(e.Name, e.Mode, e.UID, e.GID, e.DevMajor, e.DevMinor)
	}
	if err != nil {
		return fmt.Errorf("initramfs: image %s: %w", b.cfg.Image.Path(), err)
	}
	return nil
}

// extras writes what hpcvmm adds to IMAGE: mount points, the agent, the
// modules, their firmware and their list.
func (b *builder) extras(set *kmodules.Set) error {
	a := b.a
	for _, d := range []struct {
		name string
		perm fs.FileMode
	}{{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o777 | fs.ModeSticky}, {"run", 0o755}} {
		if !a.all[d.name] {
			if err := b.count(d.name, 0); err != nil {
				return err
			}
			if err := a.dir(d.name, d.perm, 0, 0); err != nil {
				return err
			}
		}
	}
	if a.dirs["dev"] && !a.all["dev/console"] {
		if err := a.node("dev/console", fs.ModeDevice|fs.ModeCharDevice|0o600, 0, 0, 5, 1); err != nil {
			return err
		}
	}
	if err := a.dir(".hpcvmm", 0o755, 0, 0); err != nil {
		return err
	}
	ag, err := os.Open(b.cfg.Agent)
	if err != nil {
		return fmt.Errorf("initramfs: agent: %w", err)
	}
	defer ag.Close()
	fi, err := ag.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: agent: %w", err)
	}
	if err := b.count(AgentPath, fi.Size()); err != nil {
		return err
	}
	// Hashed as it is copied and compared with the key's hash of it: the
	// archive holds the agent its key names, or none.
	sum := sha256.New()
	if err := a.file(strings.TrimPrefix(AgentPath, "/"), 0o755, 0, 0, fi.Size(), io.TeeReader(io.LimitReader(ag, fi.Size()), sum)); err != nil {
		return err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != b.agentSum {
		return fmt.Errorf("initramfs: agent %s changed while hpcvmm read it (SHA-256 %s, then %s): launch again", b.cfg.Agent, b.agentSum, got)
	}

	lib, err := b.libDir()
	if err != nil {
		return err
	}
	base := lib + "/modules/" + set.Release
	fromImage := strings.HasPrefix(set.Source, "image:")
	var list strings.Builder
	for _, m := range set.Modules {
		if fromImage {
			// kmodules read the image's module file apart from this walk:
			// it must be the file the walk (checked against the key) saw.
			f := base + "/" + m.File
			if sum, ok := b.modSums[f]; !ok || sum != m.FileSHA256 {
				return fmt.Errorf("initramfs: image %s: module %s is not the regular file /%s the image holds (changed while hpcvmm read it, or its modules directory is reached through a symlink): launch again, or keep /lib/modules/%s a real directory", b.cfg.Image.Path(), m.Name, f, set.Release)
			}
		}
		name := base + "/" + m.Path
		if !fromImage || !a.all[name] { // an image that has its modules uncompressed holds them already
			if err := a.ensureDirs(name); err != nil {
				return err
			}
			if err := b.count(name, int64(len(m.Data))); err != nil {
				return err
			}
			if err := a.file(name, 0o644, 0, 0, int64(len(m.Data)), bytes.NewReader(m.Data)); err != nil {
				return err
			}
		}
		list.WriteString("/" + name + "\n")
	}
	if err := b.writeFirmware(b.fw, b.cache, lib); err != nil {
		return err
	}
	l := list.String()
	if err := b.count(ModulesList, int64(len(l))); err != nil {
		return err
	}
	return a.file(strings.TrimPrefix(ModulesList, "/"), 0o644, 0, 0, int64(len(l)), strings.NewReader(l))
}

// libDir is where lib/modules/RELEASE and lib/firmware lie in the
// archive: below the target of a top-level "lib" symlink (merged /usr:
// lib → usr/lib), so the records never pass through a symlink while the
// kernel unpacks.
func (b *builder) libDir() (string, error) {
	lib := "lib"
	if t, ok := b.top["lib"]; ok {
		c := path.Clean(strings.TrimPrefix(t, "/"))
		if c == "." || c == ".." || strings.HasPrefix(c, "../") || !b.a.dirs[c] {
			return "", fmt.Errorf("initramfs: image %s: /lib is a symlink to %s, not to a directory of the image: the modules have nowhere to go", b.cfg.Image.Path(), t)
		}
		lib = c
	} else if b.a.all["lib"] && !b.a.dirs["lib"] {
		return "", fmt.Errorf("initramfs: image %s: /lib is not a directory: the modules have nowhere to go", b.cfg.Image.Path())
	}
	return lib, nil
}
