package kmodules

import (
	"errors"
	"fmt"
	"strings"
)

// Normalize returns a module name as the kernel spells it: '-' → '_'.
func Normalize(name string) string { return strings.ReplaceAll(name, "-", "_") }

// MaxName bounds a module name: the kernel's MODULE_NAME_LEN (64 bytes
// less a pointer, with the terminating NUL) on 64-bit machines.
const MaxName = 55

// ValidateName checks a module name a user gave (hpcvmm run --module):
// letters, digits, '_' and '-', at most MaxName bytes, as every module's
// name is; anything else (a path, a file name with .ko) is no name
// modules.dep could list.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxName {
		return fmt.Errorf("module name %.80q: want 1 to %d letters, digits, '_' or '-'", name, MaxName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("module name %q holds %q: want a module's name (letters, digits, '_' or '-'; no path, no .ko), as lsmod shows it", name, string(c))
		}
	}
	return nil
}

// MaxRelease bounds a kernel release: the kernel's own utsname release
// field holds 64 bytes (__NEW_UTS_LEN).
const MaxRelease = 64

// ValidateRelease checks a kernel release taken from a kernel image (its
// version string, which whoever built the image chose) before it names a
// directory under /lib/modules: one path element (no '/', not "." or
// ".."), printable ASCII without spaces, at most MaxRelease bytes. A
// release "../../home/u/mods" would otherwise make hpcvmm read modules,
// as root, from wherever the image's author wanted.
func ValidateRelease(r string) error {
	switch {
	case r == "":
		return errors.New("the kernel image carries no release in its version string: pass a distribution kernel")
	case len(r) > MaxRelease:
		return fmt.Errorf("kernel release %.80q... is %d bytes, longer than any kernel's (%d): not a release name; pass a distribution kernel", r, len(r), MaxRelease)
	case r == "." || r == "..":
		return fmt.Errorf("kernel release %q is not a release name: pass a distribution kernel", r)
	}
	for i := 0; i < len(r); i++ {
		if c := r[i]; c == '/' || c <= ' ' || c >= 0x7f {
			return fmt.Errorf("kernel release %q holds %q, which no release has (it must be one directory name under /lib/modules): pass a distribution kernel", r, string(c))
		}
	}
	return nil
}
