package kmodules

// The firmware the packed modules name (issue 32): an NVIDIA GPU's open
// kernel module requests its GSP firmware (nvidia/VERSION/gsp_ga10x.bin
// for Ampere and later, Hopper included; gsp_tu10x.bin for Turing and
// GA100) from the kernel's firmware loader when it first brings the GPU
// up, and fails without it; a NIC's or an accelerator's driver may do the
// same. A guest has no /lib/firmware of the host's, so hpcvmm finds the
// files on the host as the kernel's loader would and puts them in the
// job's initramfs at /lib/firmware/NAME.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DefaultFirmwareDir is where a host keeps firmware and where the guest
// kernel's loader looks for it.
const DefaultFirmwareDir = "/lib/firmware"

// firmwareSuffixes are the loader's variants of a name, in the order it
// tries them (drivers/base/firmware_loader/main.c, _request_firmware): the
// plain file in every directory first, then NAME.zst with
// CONFIG_FW_LOADER_COMPRESS_ZSTD, then NAME.xz with
// CONFIG_FW_LOADER_COMPRESS_XZ. A compressed file stays compressed in the
// guest, which decompresses it as the host would: Debian 12's 6.1 kernel
// (config-6.1.0-56-amd64) has CONFIG_FW_LOADER_COMPRESS_XZ=y and ZSTD not
// set, as the distributions that ship .xz firmware build theirs; those that
// ship .zst firmware (Fedora, Arch) build with ZSTD. A job boots the host's
// kernel unless told otherwise, which reads the host's /lib/firmware as it
// is.
var firmwareSuffixes = []string{"", ".zst", ".xz"}

// FirmwareDirs returns the directories the host kernel's firmware loader
// searches, in its order (main.c's fw_path), beneath the host root root
// ("" means "/"): the firmware_class.path parameter when set
// (/sys/module/firmware_class/parameters/path: a node image that installs
// the GPU driver outside the distribution points it at the driver's
// firmware), then /lib/firmware/updates/RELEASE, /lib/firmware/updates,
// /lib/firmware/RELEASE and /lib/firmware, RELEASE being the guest
// kernel's release (left out when it is not one: ValidateRelease).
func FirmwareDirs(root, release string) []string {
	if root == "" {
		root = "/"
	}
	var dirs []string
	if b, err := readBounded(filepath.Join(root, "sys/module/firmware_class/parameters/path"), 4096); err == nil {
		if p := strings.TrimSpace(string(b)); filepath.IsAbs(p) {
			dirs = append(dirs, filepath.Join(root, p))
		}
	}
	fw := filepath.Join(root, DefaultFirmwareDir)
	if ValidateRelease(release) == nil {
		dirs = append(dirs, filepath.Join(fw, "updates", release), filepath.Join(fw, "updates"), filepath.Join(fw, release))
	} else {
		dirs = append(dirs, filepath.Join(fw, "updates"))
	}
	return append(dirs, fw)
}

// FirmwareRef is a firmware file a module names.
type FirmwareRef struct {
	// Module is the (first, in load order) module that names it, Name
	// the name it gives (ValidFirmwareName), Version the module's
	// version= for messages ("" when unknown).
	Module, Name, Version string
}

// Firmware returns the firmware files the set's modules name, in load
// order, each name once.
func (s *Set) Firmware() []FirmwareRef {
	var out []FirmwareRef
	seen := map[string]bool{}
	for _, m := range s.Modules {
		for _, n := range m.Firmware {
			if !seen[n] {
				seen[n] = true
				out = append(out, FirmwareRef{Module: m.Name, Name: n, Version: m.Version})
			}
		}
	}
	return out
}

// FoundFirmware is a firmware file found on the host.
type FoundFirmware struct {
	FirmwareRef
	// Dir is the directory it was found in; Path its name there: Name,
	// or Name with ".zst" or ".xz" for a compressed variant, which is
	// also its path below the guest's /lib/firmware.
	Dir, Path string
	// Size is its size when it was found.
	Size int64
}

// MissingFirmware is a firmware file named by a module but usable in none
// of the directories, and why.
type MissingFirmware struct {
	FirmwareRef
	Why string
}

// FirmwareFiles are the outcome of FindFirmware, each list in the order
// of the references.
type FirmwareFiles struct {
	Found   []FoundFirmware
	Missing []MissingFirmware
}

// MissingFirmwareError is a required firmware file (FindFirmware's
// require) that the host does not have.
type MissingFirmwareError struct {
	MissingFirmware
	// Dirs are the directories searched.
	Dirs []string
}

func (e *MissingFirmwareError) Error() string {
	v := e.Version
	if v == "" {
		v = "VERSION"
	}
	why := ""
	if e.Why != notFound {
		why = "; " + e.Why
	}
	return fmt.Sprintf("kmodules: module %s needs firmware %s, which none of %s holds (plain, .zst or .xz%s): install the driver's firmware package (e.g. nvidia-firmware-%s)",
		e.Module, e.Name, strings.Join(e.Dirs, ", "), why, v)
}

const notFound = "not found"

// FindFirmware looks each reference up in dirs as the kernel's loader
// would: the plain name in each directory in order, then its .zst, then
// its .xz variant; the first regular file that every user may read wins.
// Each name is resolved beneath its directory (os.Root): a symbolic link
// inside it is followed, one that leads out of it (an absolute link, or
// "../" past it) is not, and the name counts as missing there. A file
// others may not read is left out too: hpcvmm may run as root for a job's
// user, who gets the guest's copy. A missing name whose Name matches a
// pattern of require (Match) is a *MissingFirmwareError, the first one,
// returned with the files; the rest are only listed in Missing: many
// modules name firmware for hardware variants the host does not have.
func FindFirmware(dirs []string, refs []FirmwareRef, require []string) (*FirmwareFiles, error) {
	roots := make([]*os.Root, len(dirs))
	for i, d := range dirs {
		if r, err := os.OpenRoot(d); err == nil {
			roots[i] = r
			defer r.Close()
		}
	}
	out := &FirmwareFiles{}
	var firstErr error
	for _, ref := range refs {
		if why := ValidFirmwareName(ref.Name); why != "" {
			return nil, &FirmwareNameError{Module: ref.Module, Name: ref.Name, Why: why}
		}
		found, why := findOne(roots, dirs, ref.Name)
		if why == "" {
			found.FirmwareRef = ref
			out.Found = append(out.Found, found)
			continue
		}
		miss := MissingFirmware{FirmwareRef: ref, Why: why}
		out.Missing = append(out.Missing, miss)
		for _, pat := range require {
			if firstErr == nil && Match(pat, ref.Name) {
				firstErr = &MissingFirmwareError{MissingFirmware: miss, Dirs: dirs}
			}
		}
	}
	return out, firstErr
}

// findOne finds name in roots (dirs' os.Root, nil where a directory could
// not be opened); why says why not ("" when found).
func findOne(roots []*os.Root, dirs []string, name string) (FoundFirmware, string) {
	var whys []string
	for _, suf := range firmwareSuffixes {
		for i, r := range roots {
			if r == nil {
				continue
			}
			p := name + suf
			fi, err := r.Stat(p)
			switch {
			case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
				continue
			case err != nil:
				whys = append(whys, fmt.Sprintf("%s: %v", filepath.Join(dirs[i], p), errors.Unwrap(err)))
			case !fi.Mode().IsRegular():
				whys = append(whys, fmt.Sprintf("%s is not a regular file (%v)", filepath.Join(dirs[i], p), fi.Mode().Type()))
			case fi.Mode().Perm()&0o004 == 0:
				whys = append(whys, fmt.Sprintf("%s is not readable by every user (mode %v)", filepath.Join(dirs[i], p), fi.Mode().Perm()))
			default:
				return FoundFirmware{Dir: dirs[i], Path: p, Size: fi.Size()}, ""
			}
		}
	}
	if len(whys) == 0 {
		return FoundFirmware{}, notFound
	}
	return FoundFirmware{}, strings.Join(whys, "; ")
}

// OpenFirmware opens a found firmware file again, beneath its directory
// as FindFirmware resolved it, and checks it is still a regular file; the
// caller compares what it reads with what it expects (its size, its
// hash).
func OpenFirmware(f FoundFirmware) (*os.File, error) {
	r, err := os.OpenRoot(f.Dir)
	if err != nil {
		return nil, fmt.Errorf("kmodules: firmware %s: %w", f.Name, err)
	}
	defer r.Close()
	// O_NONBLOCK: a FIFO put in the file's place must not block the open.
	file, err := r.OpenFile(f.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("kmodules: firmware %s: %w", f.Name, err)
	}
	fi, err := file.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is no longer a regular file", filepath.Join(f.Dir, f.Path))
	}
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("kmodules: firmware %s: %w", f.Name, err)
	}
	return file, nil
}
