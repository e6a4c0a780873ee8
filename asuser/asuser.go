// Package asuser opens the files a user names with that user's rights.
//
// hpcvmm often runs with more rights than the user it works for: as root in
// a Slurm job step whose user is SLURM_JOB_UID, or setuid. Every path that
// user names (the kernel, the initrd, the IMAGE, an --env-file, a --bind
// source, an --nccl-topo output) must then be opened as that user, or the
// user reads and writes what only root may (issue 30, item 6). Checking the
// owner and mode of a path before opening it races with a rename; checking
// them on the opened file misses ACLs, groups and the directories on the
// way. So the open itself runs with the user's file-system identity: on one
// OS thread locked for the purpose, setfsuid(2), setfsgid(2) and
// setgroups(2) as raw syscalls (they change only the calling thread; Go's
// syscall.Setgroups changes every thread of the process), the open, and the
// thread's own identity restored before it is unlocked. A thread whose
// identity could not be restored is not unlocked, so the runtime retires it.
package asuser

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// User is whom hpcvmm acts for: the file-system identity an open takes.
type User struct {
	// UID and GID are the user's ids, Groups the supplementary groups.
	UID, GID uint32
	Groups   []uint32
	// Name is the login name, for messages (may be empty).
	Name string
}

// String names the user for messages.
func (u *User) String() string {
	if u.Name != "" {
		return fmt.Sprintf("%s (uid %d)", u.Name, u.UID)
	}
	return fmt.Sprintf("uid %d", u.UID)
}

// JobUIDVar is the variable in which Slurm gives a job step its user's uid.
const JobUIDVar = "SLURM_JOB_UID"

// Acting returns the user hpcvmm acts for when that is not itself, else
// nil: when hpcvmm runs as root with SLURM_JOB_UID naming another user (a
// Slurm step or Prolog run as root for a user's job), or when its real uid
// differs from its effective uid (setuid). getenv is os.Getenv in
// production. A SLURM_JOB_UID that is not a number, or a user the system
// does not know, is an error: hpcvmm must not fall back to root's rights.
func Acting(getenv func(string) string) (*User, error) {
	euid, ruid := os.Geteuid(), os.Getuid()
	var uid int
	switch {
	case euid == 0 && getenv(JobUIDVar) != "":
		n, err := strconv.ParseUint(getenv(JobUIDVar), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: not a numeric uid; hpcvmm runs as root for a job and must know its user", JobUIDVar, getenv(JobUIDVar))
		}
		uid = int(n)
	case ruid != euid:
		uid = ruid
	default:
		return nil, nil
	}
	if uid == euid {
		return nil, nil
	}
	u, err := Lookup(uint32(uid))
	if err != nil && getenv(JobGIDVar) != "" {
		// A user the local files do not know (LDAP or SSSD, which a
		// static binary cannot ask): Slurm's own record of the user, with
		// no supplementary groups, which can only take rights away.
		gid, gerr := strconv.ParseUint(getenv(JobGIDVar), 10, 32)
		if gerr != nil {
			return nil, fmt.Errorf("%s=%q: not a numeric gid", JobGIDVar, getenv(JobGIDVar))
		}
		return &User{UID: uint32(uid), GID: uint32(gid), Groups: []uint32{}, Name: getenv("SLURM_JOB_USER")}, nil
	}
	return u, err
}

// JobGIDVar is the variable in which Slurm gives a job step its user's
// primary gid.
const JobGIDVar = "SLURM_JOB_GID"

// Home is uid's home directory from the user database ("" when unknown).
func Home(uid uint32) string {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return ""
	}
	return u.HomeDir
}

// Self is hpcvmm's own user: its effective ids and groups, named from the
// user database where it knows them (else from $USER).
func Self() *User {
	u := &User{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Groups: []uint32{}}
	if gs, err := os.Getgroups(); err == nil {
		for _, g := range gs {
			u.Groups = append(u.Groups, uint32(g))
		}
	}
	if pw, err := user.LookupId(strconv.Itoa(os.Geteuid())); err == nil {
		u.Name = pw.Username
	} else {
		u.Name = os.Getenv("USER")
	}
	return u
}

// GroupName is gid's name from the group database ("" when unknown).
func GroupName(gid uint32) string {
	g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10))
	if err != nil {
		return ""
	}
	return g.Name
}

// Lookup returns uid's user with its primary group and supplementary
// groups from the system's user database.
func Lookup(uid uint32) (*User, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil, fmt.Errorf("uid %d: %w (hpcvmm opens the job's files with its user's rights and must know the user's groups)", uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid %d: primary group %q is not numeric", uid, u.Gid)
	}
	out := &User{UID: uid, GID: uint32(gid), Name: u.Username}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("uid %d: its groups: %w", uid, err)
	}
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			continue
		}
		out.Groups = append(out.Groups, uint32(g))
	}
	return out, nil
}

// ErrIdentity is returned when the thread's file-system identity could not
// be switched; nothing was opened.
var ErrIdentity = errors.New("asuser: could not take the user's file-system identity")

// Do runs fn on one OS thread whose file-system identity (fsuid, fsgid,
// supplementary groups) is u's, then restores the thread's. With u nil it
// just runs fn. fn must not start goroutines that open files on its
// behalf: only the calling thread has u's identity.
func Do(u *User, fn func() error) error {
	if u == nil {
		return fn()
	}
	runtime.LockOSThread()
	saved, err := uapi.ThreadGroups()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("%w: reading the thread's groups: %v", ErrIdentity, err)
	}
	euid, egid := os.Geteuid(), os.Getegid()
	restore := func() bool {
		ok := uapi.ThreadSetGroups(saved) == nil
		_ = unix.Setfsgid(egid)
		_ = unix.Setfsuid(euid)
		return ok && fsuid() == euid && fsgid() == egid
	}
	if err := uapi.ThreadSetGroups(u.Groups); err != nil {
		if restore() {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("%w: setgroups: %v", ErrIdentity, err)
	}
	_ = unix.Setfsgid(int(u.GID))
	_ = unix.Setfsuid(int(u.UID))
	if fsuid() != int(u.UID) || fsgid() != int(u.GID) {
		if restore() {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("%w: setfsuid %d / setfsgid %d did not take", ErrIdentity, u.UID, u.GID)
	}
	ferr := fn()
	if restore() {
		runtime.UnlockOSThread()
	} // else: the thread stays locked and the runtime ends it with the goroutine
	return ferr
}

// OpenFile opens path as u (os.OpenFile when u is nil).
func OpenFile(u *User, path string, flag int, perm os.FileMode) (*os.File, error) {
	var f *os.File
	err := Do(u, func() error {
		var err error
		f, err = os.OpenFile(path, flag, perm)
		return err
	})
	return f, err
}

// Open opens path for reading as u.
func Open(u *User, path string) (*os.File, error) { return OpenFile(u, path, os.O_RDONLY, 0) }

// ReadFile reads path as u.
func ReadFile(u *User, path string) ([]byte, error) {
	var b []byte
	err := Do(u, func() error {
		var err error
		b, err = os.ReadFile(path)
		return err
	})
	return b, err
}

// fsuid and fsgid read the thread's current ids: setfsuid(-1) changes
// nothing and returns the current value.
func fsuid() int { id, _ := unix.SetfsuidRetUid(-1); return id }
func fsgid() int { id, _ := unix.SetfsgidRetGid(-1); return id }
