// What a Prolog grants a job's user so that the job's steps run as that
// user (issue 37): this job's VFIO group files (KindVFIOOwner) and TAPs on a
// bridge (KindTAP), journaled like every other change, so that the
// Epilog's `hpcvmm unbind` takes them back.

package hoststate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// Kinds of change a Prolog makes for the job's user.
const (
	// KindVFIOOwner is a /dev/vfio/<group> file handed to a user.
	KindVFIOOwner = "vfio-owner"
	// KindTAP is a persistent TAP created for a user on a bridge.
	KindTAP = "tap"
)

// VFIOOwnerChange records a VFIO group file handed to a user: the group
// and the owner, group and mode it had before.
type VFIOOwnerChange struct {
	Group int    `json:"group"`
	UID   uint32 `json:"uid"`
	// OriginalUID, OriginalGID and OriginalMode (permission bits) are
	// put back by the restore.
	OriginalUID  uint32 `json:"original_uid"`
	OriginalGID  uint32 `json:"original_gid"`
	OriginalMode uint32 `json:"original_mode"`
}

// TAPChange records a persistent TAP hpcvmm created for a user: the
// restore deletes it.
type TAPChange struct {
	Name   string `json:"name"`
	Bridge string `json:"bridge,omitempty"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
}

// vfioGroupMode is the mode a group file handed to a user gets: read and
// write for that user only (the file's group keeps its gid, and with it
// nothing).
const vfioGroupMode = 0o600

// maxVFIOGroup bounds a group number read from a journal (the kernel's
// are small; the bound keeps the path one plain element).
const maxVFIOGroup = 1 << 20

func (o *Options) vfioGroupPath(group int) string {
	return filepath.Join(o.DevRoot, "vfio", strconv.Itoa(group))
}

// lstatCharDev returns the owner and mode of a VFIO group file, which must
// be a character device (not a symbolic link: the path is never followed).
// /dev/vfio is root's, so nobody else can swap the file between this check
// and the change by path that follows.
func lstatCharDev(path string) (uid, gid, mode uint32, err error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, 0, 0, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return 0, 0, 0, fmt.Errorf("%s is not a character device (mode %#o): not a VFIO group file", path, st.Mode)
	}
	return st.Uid, st.Gid, st.Mode & 0o7777, nil
}

// GiveVFIOGroup hands /dev/vfio/<group> to user uid (owner uid, mode 0600,
// its group unchanged), so that a job step running as that user opens it
// without root: the owner, group and mode it had are journaled (synced)
// first, and a restore puts them back. A file that is the user's with that
// mode already is left alone and not journaled. The group's devices must
// be on vfio-pci (the file exists only then).
func (j *Journal) GiveVFIOGroup(group int, uid uint32) error {
	if group < 0 || group > maxVFIOGroup {
		return fmt.Errorf("hoststate: VFIO group %d is not a group number", group)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	path := j.opts.vfioGroupPath(group)
	ouid, ogid, omode, err := lstatCharDev(path)
	if err != nil {
		return fmt.Errorf("hoststate: give VFIO group %d to uid %d: %w (are its devices on vfio-pci?)", group, uid, err)
	}
	if ouid == uid && omode == vfioGroupMode {
		return nil
	}
	c := Change{Kind: KindVFIOOwner, VFIOOwner: &VFIOOwnerChange{Group: group, UID: uid, OriginalUID: ouid, OriginalGID: ogid, OriginalMode: omode}}
	j.f.Changes = append(j.f.Changes, c)
	if err := j.save(); err != nil {
		j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
		return fmt.Errorf("hoststate: give VFIO group %d: journal not written, nothing changed: %w", group, err)
	}
	if err := setOwner(path, uid, ogid, vfioGroupMode); err != nil {
		uerr := undoVFIOOwner(j.opts, c)
		if uerr == nil {
			j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
			j.save()
		}
		return errors.Join(fmt.Errorf("hoststate: give VFIO group %d to uid %d: %w", group, uid, err), uerr)
	}
	return nil
}

// setOwner sets a character device's owner, group and mode, never through
// a symbolic link (fchownat AT_SYMLINK_NOFOLLOW; chmod after lstatCharDev
// has checked the file is no link).
func setOwner(path string, uid, gid, mode uint32) error {
	if err := unix.Fchownat(unix.AT_FDCWD, path, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "chown", Path: path, Err: err}
	}
	if _, _, _, err := lstatCharDev(path); err != nil {
		return err
	}
	return os.Chmod(path, fs.FileMode(mode&0o777))
}

// undoVFIOOwner gives a group file back its owner, group and mode. A file
// that is gone (the devices left vfio-pci) needs nothing.
func undoVFIOOwner(o Options, c Change) error {
	v := c.VFIOOwner
	if v == nil {
		return fmt.Errorf("hoststate: restore a VFIO group's owner: journal entry without its values; check /dev/vfio by hand")
	}
	path := o.vfioGroupPath(v.Group)
	if _, _, _, err := lstatCharDev(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("hoststate: restore %s: %w", path, err)
	}
	if err := setOwner(path, v.OriginalUID, v.OriginalGID, v.OriginalMode); err != nil {
		return fmt.Errorf("hoststate: restore %s to uid %d gid %d mode %#o: %w; set it by hand (chown %d:%d %s; chmod %o %s)",
			path, v.OriginalUID, v.OriginalGID, v.OriginalMode, err, v.OriginalUID, v.OriginalGID, path, v.OriginalMode, path)
	}
	return nil
}

// CheckBridge checks that bridge exists and is a Linux bridge, before
// anything changes.
func CheckBridge(bridge string) error {
	if !validNetdev(bridge) {
		return fmt.Errorf("bridge %q is not a network interface name", bridge)
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("bridge %s does not exist: create it first (ip link add %s type bridge; ip link set %s up)", bridge, bridge, bridge)
		}
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("bridge %s is a %s interface, not a bridge", bridge, br.Type())
	}
	return nil
}

// CreateTAP creates TAP name, persistent and owned by uid and gid (so a
// process of that user attaches to it without CAP_NET_ADMIN), brought up
// and, with bridge, made a port of that bridge, which CheckBridge must
// accept. It is journaled (synced) first and the restore deletes it. A
// name that is an interface already is refused and left alone.
func (j *Journal) CreateTAP(name, bridge string, uid, gid uint32) error {
	if !validNetdev(name) {
		return fmt.Errorf("hoststate: TAP %q is not a network interface name", name)
	}
	if bridge != "" {
		if err := CheckBridge(bridge); err != nil {
			return fmt.Errorf("hoststate: TAP %s: %w", name, err)
		}
	}
	if _, err := netlink.LinkByName(name); err == nil {
		return fmt.Errorf("hoststate: TAP %s: an interface of that name exists (not made by this hpcvmm bind, so it is left alone): choose another name, or remove it (ip link del %s)", name, name)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	c := Change{Kind: KindTAP, TAP: &TAPChange{Name: name, Bridge: bridge, UID: uid, GID: gid}}
	j.f.Changes = append(j.f.Changes, c)
	if err := j.save(); err != nil {
		j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
		return fmt.Errorf("hoststate: TAP %s: journal not written, nothing changed: %w", name, err)
	}
	err := uapi.CreatePersistentTAP(name, 0, uid, gid)
	if errors.Is(err, uapi.ErrTAPExists) {
		// Made by someone else since the check: not ours to remove.
		j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
		j.save()
		return fmt.Errorf("hoststate: TAP %s exists already (not made by this hpcvmm bind, left alone): choose another name", name)
	}
	if err == nil {
		err = upOnBridge(name, bridge)
	}
	if err != nil {
		uerr := undoTAP(c)
		if uerr == nil {
			j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
			j.save()
		}
		return errors.Join(fmt.Errorf("hoststate: TAP %s: %w", name, err), uerr)
	}
	return nil
}

// upOnBridge makes TAP name a port of bridge (when given) and brings it up.
func upOnBridge(name, bridge string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if bridge != "" {
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", bridge, err)
		}
		if err := netlink.LinkSetMasterByIndex(l, br.Attrs().Index); err != nil {
			return fmt.Errorf("attach to bridge %s: %w", bridge, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring up: %w", err)
	}
	return nil
}

// undoTAP deletes the persistent TAP a KindTAP change created. A name that
// is gone needs nothing; one that is no longer a persistent TAP (another
// interface took the name, or a VM created a TAP of its own there) is left
// alone, with an error saying so.
func undoTAP(c Change) error {
	v := c.TAP
	if v == nil {
		return fmt.Errorf("hoststate: restore a TAP: journal entry without its name; check ip link by hand")
	}
	l, err := netlink.LinkByName(v.Name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("hoststate: restore TAP %s: %w", v.Name, err)
	}
	tap, ok := l.(*netlink.Tuntap)
	if !ok || tap.Mode != netlink.TUNTAP_MODE_TAP || tap.NonPersist {
		return fmt.Errorf("hoststate: restore TAP %s: it is no longer the persistent TAP hpcvmm bind created (a %s interface), so it is left alone; remove it by hand if it is stale (ip link del %s)", v.Name, l.Type(), v.Name)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("hoststate: restore TAP %s: delete: %w; delete it by hand (ip link del %s)", v.Name, err, v.Name)
	}
	return nil
}
