package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeSwitch records the system calls of a root switch as one line each
// and fails the call whose line starts with failAt.
type fakeSwitch struct {
	calls  []string
	failAt string
	noDev  bool
	// firmware: the initramfs has /lib/firmware.
	firmware bool
}

func (f *fakeSwitch) call(line string) error {
	f.calls = append(f.calls, line)
	if f.failAt != "" && strings.HasPrefix(line, f.failAt) {
		return unix.EINVAL
	}
	return nil
}

func (f *fakeSwitch) rootSwitch() rootSwitch {
	return rootSwitch{
		Mount: func(source, target, fstype string, flags uintptr, data string) error {
			return f.call(fmt.Sprintf("mount %s %s %s %s %q", source, target, fstype, mountFlags(flags), data))
		},
		MkdirAll: func(p string) error { return f.call("mkdir " + p) },
		WaitFor: func(p string, timeout time.Duration) error {
			if f.noDev {
				f.calls = append(f.calls, "wait "+p)
				return errors.New("not there after " + timeout.String())
			}
			return f.call("wait " + p)
		},
		Chdir:  func(p string) error { return f.call("chdir " + p) },
		Chroot: func(p string) error { return f.call("chroot " + p) },
		IsDir:  func(p string) bool { return f.firmware && p == "/lib/firmware" },
		WriteFile: func(p string, data []byte) error {
			return f.call(fmt.Sprintf("write %s %q", p, data))
		},
	}
}

func mountFlags(flags uintptr) string {
	var names []string
	for _, fl := range []struct {
		bit  uintptr
		name string
	}{{unix.MS_RDONLY, "ro"}, {unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_MOVE, "move"},
		{unix.MS_BIND, "bind"}, {unix.MS_REMOUNT, "remount"}} {
		if flags&fl.bit != 0 {
			names = append(names, fl.name)
			flags &^= fl.bit
		}
	}
	if flags != 0 {
		names = append(names, fmt.Sprintf("%#x", flags))
	}
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}

// TestSwitchToPMEMSequence: the image read-only, a tmpfs for the overlay's
// writable layers, the overlay, the kernel's file systems moved into it,
// then the overlay moved onto / and chroot'ed into, in that order.
func TestSwitchToPMEMSequence(t *testing.T) {
	for _, fs := range []string{"squashfs", "erofs"} {
		f := &fakeSwitch{}
		require.NoError(t, switchToPMEM(f.rootSwitch(), fs))
		assert.Equal(t, []string{
			"wait /dev/pmem0",
			"mkdir /.hpcvmm/image",
			"mount /dev/pmem0 /.hpcvmm/image " + fs + ` ro,nodev ""`,
			"mkdir /.hpcvmm/rw",
			`mount tmpfs /.hpcvmm/rw tmpfs nosuid,nodev "mode=0755"`,
			"mkdir /.hpcvmm/rw/upper",
			"mkdir /.hpcvmm/rw/work",
			"mkdir /.hpcvmm/newroot",
			`mount overlay /.hpcvmm/newroot overlay - "lowerdir=/.hpcvmm/image,upperdir=/.hpcvmm/rw/upper,workdir=/.hpcvmm/rw/work"`,
			"mkdir /.hpcvmm/newroot/proc",
			`mount /proc /.hpcvmm/newroot/proc  move ""`,
			"mkdir /.hpcvmm/newroot/sys",
			`mount /sys /.hpcvmm/newroot/sys  move ""`,
			"mkdir /.hpcvmm/newroot/dev",
			`mount /dev /.hpcvmm/newroot/dev  move ""`,
			"mkdir /.hpcvmm/newroot/tmp",
			`mount /tmp /.hpcvmm/newroot/tmp  move ""`,
			"chdir /.hpcvmm/newroot",
			`mount /.hpcvmm/newroot /  move ""`,
			"chroot .",
			"chdir /",
		}, f.calls)
	}
}

// TestSwitchToPMEMKeepsFirmware: an initramfs with /lib/firmware (a GPU's
// GSP firmware) keeps it read-only at /.hpcvmm/firmware in the new root and
// points the kernel's firmware loader there once the switch is done; a
// failure of either is the switch's error.
func TestSwitchToPMEMKeepsFirmware(t *testing.T) {
	f := &fakeSwitch{firmware: true}
	require.NoError(t, switchToPMEM(f.rootSwitch(), "squashfs"))
	at := func(line string) int {
		i := slices.Index(f.calls, line)
		require.GreaterOrEqual(t, i, 0, "%q in %v", line, f.calls)
		return i
	}
	overlay := slices.IndexFunc(f.calls, func(c string) bool { return strings.HasPrefix(c, "mount overlay") })
	bind := at(`mount /lib/firmware /.hpcvmm/newroot/.hpcvmm/firmware  bind ""`)
	ro := at(`mount  /.hpcvmm/newroot/.hpcvmm/firmware  ro,bind,remount ""`)
	moveProc := at(`mount /proc /.hpcvmm/newroot/proc  move ""`)
	chroot := at("chroot .")
	write := at(`write /sys/module/firmware_class/parameters/path "/.hpcvmm/firmware"`)
	assert.True(t, overlay < bind && bind < ro && ro < moveProc && chroot < write, "order: %v", f.calls)
	assert.Equal(t, len(f.calls)-1, write, "the loader's path is set last, inside the new root")

	for _, tc := range []struct{ failAt, want string }{
		{"mount /lib/firmware", "keeping the initramfs's firmware at /.hpcvmm/firmware"},
		{"write ", "pointing the kernel's firmware loader at /.hpcvmm/firmware"},
	} {
		f := &fakeSwitch{firmware: true, failAt: tc.failAt}
		assert.ErrorContains(t, switchToPMEM(f.rootSwitch(), "erofs"), tc.want)
	}
	f = &fakeSwitch{}
	require.NoError(t, switchToPMEM(f.rootSwitch(), "squashfs"))
	assert.NotContains(t, strings.Join(f.calls, "\n"), "firmware", "without firmware in the initramfs nothing is kept")
}

// TestSwitchToPMEMStopsAtTheFirstFailure: each failing step stops the
// switch there, with an error naming it; nothing after it is tried.
func TestSwitchToPMEMStopsAtTheFirstFailure(t *testing.T) {
	for _, tc := range []struct{ failAt, want string }{
		{"mount /dev/pmem0", "mounting the image (squashfs on /dev/pmem0, /.hpcvmm/image)"},
		{"mount tmpfs", "mounting the overlay's tmpfs"},
		{"mount overlay", "mounting the overlay over the image (lowerdir="},
		{"mount /dev ", "moving /dev into the image"},
		{"mkdir /.hpcvmm/newroot/proc", "making /proc in the image"},
		{"mount /.hpcvmm/newroot /", "moving the image's root onto /"},
		{"chroot", "chroot"},
	} {
		f := &fakeSwitch{failAt: tc.failAt}
		err := switchToPMEM(f.rootSwitch(), "squashfs")
		require.Error(t, err, tc.failAt)
		assert.Contains(t, err.Error(), tc.want)
		assert.ErrorIs(t, err, unix.EINVAL)
		assert.True(t, strings.HasPrefix(f.calls[len(f.calls)-1], tc.failAt), "stopped at %q: %v", tc.failAt, f.calls)
	}
	f := &fakeSwitch{noDev: true}
	err := switchToPMEM(f.rootSwitch(), "squashfs")
	assert.ErrorContains(t, err, "/dev/pmem0 did not appear (the guest kernel needs nd_e820 and nd_pmem)")
	assert.Equal(t, []string{"wait /dev/pmem0"}, f.calls, "nothing mounted without the device")
}

func TestPMEMFSType(t *testing.T) {
	for cmdline, want := range map[string]string{
		"console=ttyS0 quiet rdinit=/.hpcvmm/hpcvmm-agent":                  "",
		"console=ttyS0 hpcvmm.pmem=squashfs rdinit=/.hpcvmm/hpcvmm-agent\n": "squashfs",
		"hpcvmm.pmem=erofs": "erofs",
		"xhpcvmm.pmem=erofs hpcvmm.pmemx=1 console=ttyS0": "",
	} {
		got, err := pmemFSType(cmdline)
		require.NoError(t, err, cmdline)
		assert.Equal(t, want, got, cmdline)
	}
	_, err := pmemFSType("hpcvmm.pmem=ext4")
	assert.ErrorContains(t, err, `hpcvmm.pmem="ext4": want squashfs or erofs`)
}

func TestPMEMRootFromCmdline(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "cmdline")
		require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	f := &fakeSwitch{}
	require.NoError(t, pmemRootFromCmdline(f.rootSwitch(), write("console=ttyS0 quiet\n")))
	assert.Empty(t, f.calls, "no hpcvmm.pmem: the initramfs stays the root")
	require.NoError(t, pmemRootFromCmdline(f.rootSwitch(), write("console=ttyS0 hpcvmm.pmem=erofs\n")))
	assert.Contains(t, f.calls, `mount /dev/pmem0 /.hpcvmm/image erofs ro,nodev ""`)
	assert.Error(t, pmemRootFromCmdline(f.rootSwitch(), filepath.Join(dir, "missing")))
}

func TestWaitFor(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pmem0")
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = os.WriteFile(p, nil, 0o644)
	}()
	require.NoError(t, waitFor(p, 5*time.Second))
	assert.ErrorContains(t, waitFor(p+"x", 20*time.Millisecond), "not there after")
}
