package kmodules

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// ModInfo is what hpcvmm reads of a module's .modinfo section: the
// NUL-separated "key=value" records modinfo(8) prints.
type ModInfo struct {
	// Firmware are the firmware files the module may request
	// (MODULE_FIRMWARE; `modinfo -F firmware`), in the section's order,
	// each once, each a clean path relative to /lib/firmware
	// (ValidFirmwareName).
	Firmware []string
	// Version is the module's version= record ("" when it has none or
	// it is no printable word): only ever shown in messages.
	Version string
}

// Bounds on what ParseModinfo accepts: a distribution module's .modinfo
// is a few KiB (its aliases are most of it; the largest, a GPU driver's,
// tens of KiB), a firmware name is a path under /lib/firmware.
const (
	maxModinfoBytes  = 16 << 20
	MaxFirmwareName  = 512
	maxVersionLength = 64
)

// FirmwareNameError is a firmware= record that is not a clean path
// relative to /lib/firmware: whoever built the module (IMAGE's author, for
// IMAGE's modules) chose it, and hpcvmm looks firmware up beneath the
// host's firmware directories by that name.
type FirmwareNameError struct {
	// Module is the module's name ("" when ParseModinfo is called on
	// bytes alone), Name the record's value and Why what is wrong.
	Module, Name, Why string
}

func (e *FirmwareNameError) Error() string {
	mod := ""
	if e.Module != "" {
		mod = "module " + e.Module + " "
	}
	return fmt.Sprintf("kmodules: %snames firmware %.100q, which %s: a module names its firmware by a path relative to /lib/firmware; this one is corrupt or was built to reach other files, so leave it out of the kernel's module tree", mod, e.Name, e.Why)
}

// ValidFirmwareName checks a firmware name a module gives before it names
// a file: not empty, at most MaxFirmwareName bytes, relative, clean
// (path.Clean leaves it as it is: no "//", "./" or trailing '/'), no ".."
// element, no NUL or other control byte (it goes into logs). It returns
// what is wrong, "" for a valid name.
func ValidFirmwareName(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > MaxFirmwareName:
		return fmt.Sprintf("is longer than %d bytes", MaxFirmwareName)
	case strings.HasPrefix(name, "/"):
		return "is an absolute path"
	case name == "." || name == ".." || strings.HasPrefix(name, "../"):
		return "leads out of /lib/firmware (\"..\")"
	case path.Clean(name) != name:
		return "is not a clean path (\"//\", \".\" or \"..\" elements, or a trailing '/')"
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < ' ' || c == 0x7f {
			return fmt.Sprintf("holds the control byte %#02x", c)
		}
	}
	return ""
}

// ParseModinfo reads the .modinfo section of a module's ELF object (a
// decompressed .ko). An object debug/elf cannot read, or without a
// .modinfo section (every module the kernel builds has one), is an error;
// so is a firmware= record that ValidFirmwareName refuses
// (*FirmwareNameError).
func ParseModinfo(obj []byte) (ModInfo, error) {
	f, err := elf.NewFile(bytes.NewReader(obj))
	if err != nil {
		return ModInfo{}, fmt.Errorf("not an ELF object: %w", err)
	}
	return modinfoOf(f)
}

// modinfoOf reads the .modinfo section of an opened ELF object.
func modinfoOf(f *elf.File) (ModInfo, error) {
	s := f.Section(".modinfo")
	switch {
	case s == nil:
		return ModInfo{}, errors.New("no .modinfo section: not a kernel module")
	case s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_COMPRESSED != 0:
		return ModInfo{}, errors.New("its .modinfo section holds no plain data")
	case s.Size > maxModinfoBytes:
		return ModInfo{}, fmt.Errorf("its .modinfo section is %d bytes, more than any module's (%d)", s.Size, maxModinfoBytes)
	}
	data, err := s.Data()
	if err != nil {
		return ModInfo{}, fmt.Errorf("its .modinfo section: %w", err)
	}
	return parseModinfoSection(data)
}

// parseModinfoSection reads the records of a .modinfo section's bytes.
func parseModinfoSection(data []byte) (ModInfo, error) {
	var info ModInfo
	seen := map[string]bool{}
	for _, rec := range bytes.Split(data, []byte{0}) {
		key, val, ok := bytes.Cut(rec, []byte("="))
		if !ok {
			continue // padding between records
		}
		switch string(key) {
		case "firmware":
			name := string(val)
			if why := ValidFirmwareName(name); why != "" {
				return ModInfo{}, &FirmwareNameError{Name: name, Why: why}
			}
			if !seen[name] {
				seen[name] = true
				info.Firmware = append(info.Firmware, name)
			}
		case "version":
			if v := string(val); validVersion(v) {
				info.Version = v
			}
		}
	}
	return info, nil
}

// validVersion accepts a version= value worth showing: one printable word.
func validVersion(v string) bool {
	if v == "" || len(v) > maxVersionLength {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// ModuleInfo reads the .modinfo of module name (normalized) of kernel
// release in the host's modules directory hostDir ("": DefaultHostDir)
// without resolving anything else: modules.dep for its path, then its
// file. An uncompressed .ko costs its ELF section headers and .modinfo
// (debug/elf reads them at their offsets); a compressed one is
// decompressed whole. A module modules.dep does not list is an
// *UnknownModuleError (built-in modules have no file to read). It is what
// `hpcvmm check` reads of the guest kernel's nvidia module.
func ModuleInfo(hostDir, release, name string) (ModInfo, error) {
	if hostDir == "" {
		hostDir = DefaultHostDir
	}
	if err := ValidateRelease(release); err != nil {
		return ModInfo{}, fmt.Errorf("kmodules: %w", err)
	}
	dir := filepath.Join(hostDir, release)
	dep, err := readBounded(filepath.Join(dir, "modules.dep"), maxIndexBytes)
	if err != nil {
		return ModInfo{}, fmt.Errorf("kmodules: %w", err)
	}
	ix, err := parseIndex(dep, nil, nil, nil)
	if err != nil {
		return ModInfo{}, fmt.Errorf("kmodules: %s: %w", dir, err)
	}
	n := Normalize(name)
	p := ix.paths[n]
	if p == "" {
		return ModInfo{}, &UnknownModuleError{Name: n, Release: release, Where: dir}
	}
	file := filepath.Join(dir, filepath.FromSlash(p))
	var info ModInfo
	if strings.HasSuffix(p, ".ko") {
		info, err = modinfoOfFile(file)
	} else {
		var b []byte
		if b, err = readBounded(file, maxModuleBytes); err == nil {
			if b, err = decompress(p, b); err == nil {
				info, err = ParseModinfo(b)
			}
		}
	}
	var fe *FirmwareNameError
	if errors.As(err, &fe) {
		fe.Module = n
		return ModInfo{}, fe
	}
	if err != nil {
		return ModInfo{}, fmt.Errorf("kmodules: %s: %w", file, err)
	}
	return info, nil
}

// modinfoOfFile is ParseModinfo of an uncompressed module file, reading
// only its headers and .modinfo.
func modinfoOfFile(file string) (ModInfo, error) {
	f, err := elf.Open(file)
	if err != nil {
		return ModInfo{}, fmt.Errorf("not an ELF object: %w", err)
	}
	defer f.Close()
	return modinfoOf(f)
}
