// Package trustfs holds the rules for the files and directories hpcvmm
// trusts because no other local user can write them: the kernel cache
// (package vmlinux), the initramfs cache (package initramfs) and the
// host-state journals (package hoststate). Whoever can write to one of
// those chooses what every VM boots, or what a root `hpcvmm unbind` writes
// into sysfs, so each is refused unless it is owned by root or hpcvmm's
// user, writable by no group or other user, of the expected kind and not a
// symbolic link; and each file is written by temporary file and rename, so
// a concurrent reader sees the old file or the new one, never a part.
//
// The caches are also private (issue 30 item 2): an initramfs holds every
// file of a user's image, 0600 ones included, and its index and hash
// records name them all, so cache directories are 0700 (PrivateDir) and
// their files 0400 (WriteFile's perm, Private), and one an older hpcvmm
// left readable is tightened on its descriptor when hpcvmm owns it.
//
// The rules lived as copies in those three packages; they are here once so
// that a fix to one reaches all. The wording of a refusal stays the
// caller's (Error.Explain): each names its own flag and fix.
package trustfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Problem is why Check refused a path.
type Problem int

// The problems Check reports, in the order it checks them.
const (
	// Symlink: the path is a symbolic link (its target is anyone's choice).
	Symlink Problem = iota + 1
	// WrongType: a directory where a regular file was expected, or not a
	// directory where one was.
	WrongType
	// NoOwner: the file information carries no owner (not a *syscall.Stat_t).
	NoOwner
	// ForeignOwner: owned by a user other than root or hpcvmm's.
	ForeignOwner
	// OpenMode: writable by group or others.
	OpenMode
)

// Error is Check's refusal: the path, the problem and the facts behind it.
type Error struct {
	Path    string
	Problem Problem
	Type    fs.FileMode // the path's type bits (WrongType)
	UID     uint32      // the owner (ForeignOwner)
	OurUID  uint32      // hpcvmm's effective uid (ForeignOwner)
	Perm    fs.FileMode // the permission bits (OpenMode)
}

// phrase is what Error says about the path, to follow its name.
func (e *Error) phrase() string {
	switch e.Problem {
	case Symlink:
		return " is a symbolic link"
	case WrongType:
		return fmt.Sprintf(" is a %v", e.Type)
	case NoOwner:
		return ": no owner information"
	case ForeignOwner:
		return fmt.Sprintf(" is owned by uid %d, not root or hpcvmm's uid %d", e.UID, e.OurUID)
	case OpenMode:
		return fmt.Sprintf(" has mode %04o, writable by group or others", e.Perm)
	}
	return fmt.Sprintf(": untrusted (problem %d)", e.Problem)
}

// Error names the path and the problem, without a fix; callers that talk
// to a user use Explain.
func (e *Error) Error() string { return e.Path + e.phrase() }

// Wording is how a caller's refusal reads: "<Subject><problem>: <Fix>".
type Wording struct {
	// Subject names the path for the user, e.g. "vmlinux: kernel cache
	// file /var/cache/hpcvmm/kernels/x.vmlinux".
	Subject string
	// Kind, when set, is the kind expected, said after a WrongType
	// (", not a directory").
	Kind string
	// Fix is what the user should do.
	Fix string
	// OwnerRisk and ModeRisk say who could abuse a ForeignOwner or an
	// OpenMode path (", who could ...").
	OwnerRisk, ModeRisk string
	// ModeFix, when set, replaces Fix after an OpenMode.
	ModeFix string
}

// Explain returns the one-line error for the user that w words. The
// *Error stays in its chain (errors.As), so a caller can tell a refused
// path from its other errors (hpcvmm exits 3 for one: the host is at
// fault, not the input).
func (e *Error) Explain(w Wording) error {
	return &explained{msg: e.explain(w), err: e}
}

// explained is Explain's error: the caller's words, the *Error beneath.
type explained struct {
	msg string
	err *Error
}

func (x *explained) Error() string { return x.msg }
func (x *explained) Unwrap() error { return x.err }

func (e *Error) explain(w Wording) string {
	fix := w.Fix
	switch e.Problem {
	case NoOwner:
		return fmt.Sprintf("%s%s", w.Subject, e.phrase())
	case WrongType:
		if w.Kind != "" {
			return fmt.Sprintf("%s%s, not a %s: %s", w.Subject, e.phrase(), w.Kind, fix)
		}
	case ForeignOwner:
		return fmt.Sprintf("%s%s%s: %s", w.Subject, e.phrase(), w.OwnerRisk, fix)
	case OpenMode:
		if w.ModeFix != "" {
			fix = w.ModeFix
		}
		return fmt.Sprintf("%s%s%s: %s", w.Subject, e.phrase(), w.ModeRisk, fix)
	}
	return fmt.Sprintf("%s%s: %s", w.Subject, e.phrase(), fix)
}

// Check refuses path, whose Lstat (or, for an open file, Stat) is fi, when
// it is a symbolic link, not a directory (dir) or not a regular file
// (!dir), owned by a user other than root or hpcvmm's, or writable by
// group or others. It returns nil when the path can be trusted.
func Check(path string, fi fs.FileInfo, dir bool) *Error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return &Error{Path: path, Problem: Symlink}
	case dir && !fi.IsDir(), !dir && !fi.Mode().IsRegular():
		return &Error{Path: path, Problem: WrongType, Type: fi.Mode().Type()}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return &Error{Path: path, Problem: NoOwner}
	}
	if uid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != uid {
		return &Error{Path: path, Problem: ForeignOwner, UID: st.Uid, OurUID: uid}
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return &Error{Path: path, Problem: OpenMode, Perm: perm}
	}
	return nil
}

// OnlyWeWrite reports whether fi is a file only root and hpcvmm's user can
// write: owned by one of them, not writable by group or others (Check's
// owner and mode rules, without its kind rules).
func OnlyWeWrite(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return (st.Uid == 0 || st.Uid == uint32(os.Geteuid())) && fi.Mode().Perm()&0o022 == 0
}

// PrivateFile is the mode of a cache's files: read-only, for hpcvmm's
// user alone (root reads it all the same).
const PrivateFile fs.FileMode = 0o400

// PrivateDir is the mode of a cache directory: hpcvmm's user alone.
const PrivateDir fs.FileMode = 0o700

// Private makes the open file f, whose Stat is fi, readable by its owner
// alone when it is hpcvmm's and group or others may read or search it
// (fchmod on the descriptor: no path is resolved again); it returns the
// mode the file has now. A file of another owner (root's, read by another
// user) is left as it is.
func Private(f *os.File, fi fs.FileInfo) (fs.FileMode, error) {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || perm&0o077 == 0 || st.Uid != uint32(os.Geteuid()) {
		return perm, nil
	}
	if err := f.Chmod(perm &^ 0o077); err != nil {
		return perm, fmt.Errorf("%s has mode %04o, readable by others, and chmod failed: %w", f.Name(), perm, err)
	}
	return perm &^ 0o077, nil
}

// MakePrivateDir creates dir and its missing parents PrivateDir (0700),
// and makes an existing dir private (Private) when hpcvmm owns it. It
// opens dir with O_NOFOLLOW: a symbolic link there is an error (Check's
// rules stay the caller's to apply, for its wording).
func MakePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, PrivateDir); err != nil {
		return err
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	_, err = Private(f, fi)
	return err
}

// WriteFile writes chunks to path with mode perm (PrivateFile for a
// cache's files) and atomically: to a temporary file in path's directory
// named tempPrefix and a random tail (created 0600), synced first when
// sync is set (a file that must survive a crash, not only a record that
// can be rebuilt), then renamed over path. On an error the temporary file
// is removed; the error names the step and the file.
func WriteFile(path, tempPrefix string, perm fs.FileMode, sync bool, chunks ...[]byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	for _, c := range chunks {
		if _, err = f.Write(c); err != nil {
			return fmt.Errorf("write %s: %w", tmp, err)
		}
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if sync {
		if err = f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", tmp, err)
		}
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	return os.Rename(tmp, path)
}
