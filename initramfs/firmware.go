package initramfs

// The firmware the archive's modules name (issue 32), at
// /lib/firmware/NAME in the guest, where its kernel's loader looks: found
// on the host by kmodules.FindFirmware, each file's SHA-256 in the cache
// key (remembered by the file's identity, as the agent's: a warm launch
// stats the files and reads the records, it hashes nothing), the file
// hashed again as it is copied into the archive and checked against the
// key's. Which names the modules give is known only from their .modinfo,
// so reading it would cost every launch the modules' decompression; the
// names are recorded instead, per key of everything else
// ("fw-<that key>.refs"): the modules that key names always name the same
// firmware.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/kmodules"
)

const (
	refsPrefix = "fw-"
	refsExt    = ".refs"
)

// firmwareDirs are the host directories searched for firmware.
func (cfg Config) firmwareDirs() []string {
	if cfg.HostFirmware != nil {
		return cfg.HostFirmware
	}
	return kmodules.FirmwareDirs("", cfg.Release)
}

func (cfg Config) log() *slog.Logger {
	if cfg.Log != nil {
		return cfg.Log
	}
	return slog.Default()
}

// fwPlan is the firmware an archive carries.
type fwPlan struct {
	refs  []kmodules.FirmwareRef
	files *kmodules.FirmwareFiles
	sums  [][sha256.Size]byte // of files.Found, in order
}

func (c *Cache) refsPath(base string) string {
	return filepath.Join(c.Dir(), refsPrefix+base+refsExt)
}

// readRefs returns the firmware names recorded for the key base, false
// when there is no usable record.
func (c *Cache) readRefs(base string) ([]kmodules.FirmwareRef, bool) {
	lines := c.ReadRecord(c.refsPath(base))
	if len(lines) == 0 || lines[0] != "firmware of "+base {
		return nil, false
	}
	refs := []kmodules.FirmwareRef{}
	for _, l := range lines[1:] {
		var f [3]string
		for i := range f {
			q, err := strconv.QuotedPrefix(l)
			if err != nil {
				return nil, false
			}
			if f[i], err = strconv.Unquote(q); err != nil {
				return nil, false
			}
			l = strings.TrimPrefix(l[len(q):], " ")
		}
		if kmodules.ValidFirmwareName(f[1]) != "" {
			return nil, false
		}
		refs = append(refs, kmodules.FirmwareRef{Module: f[0], Name: f[1], Version: f[2]})
	}
	now := time.Now()
	_ = os.Chtimes(c.refsPath(base), now, now) // a used record is kept (evict)
	return refs, true
}

// writeRefs records the firmware names of the key base (failures
// ignored: the next launch resolves the modules again).
func (c *Cache) writeRefs(base string, refs []kmodules.FirmwareRef) {
	lines := []string{"firmware of " + base}
	for _, r := range refs {
		lines = append(lines, strconv.Quote(r.Module)+" "+strconv.Quote(r.Name)+" "+strconv.Quote(r.Version))
	}
	c.WriteRecord(c.refsPath(base), lines...)
}

// planFirmware finds refs on the host and takes each found file's
// SHA-256. A required file missing (Config.RequireFirmware) is
// kmodules' *MissingFirmwareError.
func planFirmware(cfg Config, cache *Cache, refs []kmodules.FirmwareRef) (*fwPlan, error) {
	files, err := kmodules.FindFirmware(cfg.firmwareDirs(), refs, cfg.RequireFirmware)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	p := &fwPlan{refs: refs, files: files}
	for _, f := range files.Found {
		file, err := kmodules.OpenFirmware(f)
		if err != nil {
			return nil, fmt.Errorf("initramfs: %w", err)
		}
		sum, _, err := cache.OpenSHA256(file, hostPath(f))
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("initramfs: firmware %s: %w", hostPath(f), err)
		}
		p.sums = append(p.sums, sum)
	}
	return p, nil
}

// hostPath is where a found file lies on the host, absolute.
func hostPath(f kmodules.FoundFirmware) string {
	p, _ := filepath.Abs(filepath.Join(f.Dir, f.Path))
	return p
}

// key is the cache key: base and the firmware.
func (p *fwPlan) key(base string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", base)
	for i, f := range p.files.Found {
		fmt.Fprintf(h, "firmware %q %x\n", f.Path, p.sums[i])
	}
	for _, m := range p.files.Missing {
		fmt.Fprintf(h, "missing %q\n", m.Name)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// sameRefs reports whether a module set names the firmware the plan was
// made for.
func (p *fwPlan) sameRefs(refs []kmodules.FirmwareRef) bool {
	if len(refs) != len(p.refs) {
		return false
	}
	for i := range refs {
		if refs[i] != p.refs[i] {
			return false
		}
	}
	return true
}

// fill puts the plan into a Result.
func (p *fwPlan) fill(r *Result) {
	r.Firmware = nil
	for _, f := range p.files.Found {
		r.Firmware = append(r.Firmware, f.Path)
	}
	r.MissingFirmware = p.files.Missing
}

// logMissing logs, a line per module, the firmware it names that the
// host does not have: many modules name files for hardware variants the
// host lacks, so it is no error, but a device whose driver then fails in
// the guest is explained here.
func (p *fwPlan) logMissing(log *slog.Logger) {
	var order []string
	byModule := map[string][]string{}
	for _, m := range p.files.Missing {
		if byModule[m.Module] == nil {
			order = append(order, m.Module)
		}
		byModule[m.Module] = append(byModule[m.Module], m.Name+" ("+m.Why+")")
	}
	for _, mod := range order {
		log.Info("initramfs: firmware the module names is not on the host; the guest gets none", "module", mod, "firmware", strings.Join(byModule[mod], ", "))
	}
}

// writeFirmware writes the plan's files below lib (the archive's /lib or
// its target) as lib/firmware/PATH, each hashed as it is copied and
// checked against the key's hash. A file IMAGE already holds at that
// path is left as IMAGE has it, as its uncompressed modules are.
func (b *builder) writeFirmware(plan *fwPlan, cache *Cache, lib string) error {
	for i, f := range plan.files.Found {
		name := lib + "/firmware/" + f.Path
		if b.a.all[name] {
			continue
		}
		if err := b.copyFirmware(f, name, plan.sums[i], cache); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) copyFirmware(f kmodules.FoundFirmware, name string, want [sha256.Size]byte, cache *Cache) error {
	file, err := kmodules.OpenFirmware(f)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: firmware %s: %w", hostPath(f), err)
	}
	if err := b.a.ensureDirs(name); err != nil {
		return err
	}
	if err := b.count(name, fi.Size()); err != nil {
		return err
	}
	h := sha256.New()
	if err := b.a.file(name, 0o644, 0, 0, fi.Size(), io.TeeReader(io.LimitReader(file, fi.Size()), h)); err != nil {
		return err
	}
	var got [sha256.Size]byte
	if h.Sum(got[:0]); !bytes.Equal(got[:], want[:]) {
		cache.Forget(hostPath(f))
		return fmt.Errorf("initramfs: firmware %s changed while hpcvmm read it (SHA-256 %x, then %x): launch again", hostPath(f), want, got)
	}
	return nil
}
