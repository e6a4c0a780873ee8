package net

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/hoststate"
)

// tapUserChildEnv makes the test binary the child of
// TestPersistentTAPOpenedByItsUser: it becomes uid 65534 (no capabilities)
// and opens the TAPs as hpcvmm run does.
const tapUserChildEnv = "HPCVMM_TEST_TAP_USER_CHILD"

// tapUserChild runs in the network namespace of its parent's thread. It
// drops to uid/gid 65534, shows that it cannot create a TAP (so it has no
// CAP_NET_ADMIN), opens the Prolog's TAP through OpenVMTAP with its bridge
// (hpcvmm run's path), and tries a TAP someone else owns.
func tapUserChild() {
	fail := func(format string, a ...any) {
		fmt.Printf("RESULT error=%s\n", strings.ReplaceAll(fmt.Sprintf(format, a...), " ", "_"))
		os.Exit(1)
	}
	if node := os.Getenv(tapUserChildEnv + "_TUN"); node != "" {
		// This host's /dev/net/tun is root's only (distributions make it
		// 0666): in this child's own mount namespace a 0666 node of the
		// same device stands over it. The host's node is untouched.
		if err := unix.Mount(node, "/dev/net/tun", "", unix.MS_BIND, ""); err != nil {
			fail("bind %s over /dev/net/tun: %v", node, err)
		}
	}
	if err := syscall.Setgroups(nil); err != nil {
		fail("setgroups: %v", err)
	}
	if err := syscall.Setgid(65534); err != nil {
		fail("setgid: %v", err)
	}
	if err := syscall.Setuid(65534); err != nil {
		fail("setuid: %v", err)
	}
	if _, err := OpenTAP("hpu9", 1); err == nil || !errors.Is(err, unix.EPERM) {
		fail("creating a TAP as uid 65534 gave %v, want EPERM", err)
	}
	if err := CheckBridge("hpu0", "hpubr0"); err != nil {
		fail("CheckBridge: %v", err)
	}
	tap, err := OpenVMTAP("hpu0", 1, "hpubr0")
	if err != nil {
		fail("OpenVMTAP: %v", err)
	}
	if tap.Created() {
		fail("the Prolog's TAP reported as created by this process")
	}
	if err := tap.Close(); err != nil {
		fail("close: %v", err)
	}
	_, err = OpenVMTAP("hpu1", 1, "")
	fmt.Printf("RESULT other=%s\n", strings.ReplaceAll(fmt.Sprint(err), " ", "_"))
	fmt.Println("RESULT opened=ok")
	os.Exit(0)
}

// TestPersistentTAPOpenedByItsUser: a TAP the Prolog's code (hoststate's
// CreateTAP, as hpcvmm bind --tap runs it as root) makes for uid 65534 on
// a bridge, in a private network namespace, is opened by a child process
// running as 65534 without CAP_NET_ADMIN through OpenVMTAP, the path of
// hpcvmm run --net tap=NAME,bridge=BRIDGE, and is left in place, still
// persistent, owned by 65534, up and on the bridge, for the Epilog. A TAP
// owned by root is refused to that child.
func TestPersistentTAPOpenedByItsUser(t *testing.T) {
	inNetns(t, func() {
		require.NoError(t, netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "hpubr0"}}))
		br, err := netlink.LinkByName("hpubr0")
		require.NoError(t, err)
		j := hoststate.Open(hoststate.Options{StateDir: t.TempDir(), SysfsRoot: t.TempDir()})
		require.NoError(t, j.CreateTAP("hpu0", "hpubr0", 65534, 65534))
		out, err := exec.Command("ip", "tuntap", "add", "dev", "hpu1", "mode", "tap", "user", "0").CombinedOutput()
		require.NoError(t, err, "%s", out)

		// The child is forked from this thread, so it is in this namespace.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), tapUserChildEnv+"=1")
		if fi, err := os.Stat("/dev/net/tun"); err == nil && fi.Mode().Perm()&0o006 != 0o006 {
			node := filepath.Join(t.TempDir(), "tun")
			require.NoError(t, unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(10, 200))))
			require.NoError(t, os.Chmod(node, 0o666))
			cmd.Env = append(cmd.Env, tapUserChildEnv+"_TUN="+node)
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}
		}
		b, err := cmd.CombinedOutput()
		got := string(b)
		assert.NoError(t, err, "child: %s", got)
		assert.Contains(t, got, "RESULT opened=ok")
		assert.Contains(t, got, "RESULT other=tap_hpu1:_exists_but_this_user_may_not_attach_to_it")

		l, err := netlink.LinkByName("hpu0")
		require.NoError(t, err, "the TAP is left for the Epilog")
		tap, ok := l.(*netlink.Tuntap)
		require.True(t, ok)
		assert.False(t, tap.NonPersist)
		assert.Equal(t, uint32(65534), tap.Owner)
		assert.Equal(t, br.Attrs().Index, l.Attrs().MasterIndex, "still on the bridge")
		assert.NotZero(t, l.Attrs().RawFlags&unix.IFF_UP, "still up")
		require.NoError(t, j.Restore())
		_, err = netlink.LinkByName("hpu0")
		assert.Error(t, err, "the journal's restore deletes it")
	})
}
