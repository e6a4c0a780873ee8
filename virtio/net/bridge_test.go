package net

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/vishvananda/netlink"
)

// bridgeChildEnv makes the test binary the child of TestTAPOnBridgeKilled:
// it opens a TAP, puts it on the bridge, says so, and waits to be killed.
const bridgeChildEnv = "HPCVMM_TEST_BRIDGE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(tapUserChildEnv) == "1" {
		tapUserChild()
	}
	if os.Getenv(bridgeChildEnv) == "1" {
		tap, err := OpenTAP("hpvb1", 1)
		if err == nil {
			err = tap.SetBridge("hpvbr0")
		}
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func masterOf(t *testing.T, name string) int {
	l, err := netlink.LinkByName(name)
	if !assert.NoError(t, err) {
		return -1
	}
	return l.Attrs().MasterIndex
}

// TestTAPOnBridge: a missing bridge, a non-bridge and a TAP someone else
// made are refused before anything changes; a TAP hpcvmm creates becomes a
// port of the bridge and goes away, port and all, with Close.
func TestTAPOnBridge(t *testing.T) {
	inNetns(t, func() {
		assert.ErrorContains(t, CheckBridge("hpvb0", "hpvbr0"), "bridge hpvbr0 does not exist: create it first")
		assert.ErrorContains(t, CheckBridge("hpvb0", "lo"), "bridge lo is a device interface, not a bridge")
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "hpvbr0"}}
		if !assert.NoError(t, netlink.LinkAdd(br)) {
			return
		}
		assert.NoError(t, netlink.LinkSetUp(br))
		brl, err := netlink.LinkByName("hpvbr0")
		if !assert.NoError(t, err) {
			return
		}
		assert.NoError(t, CheckBridge("hpvb0", "hpvbr0"))

		tap, err := OpenTAP("hpvb0", 1)
		if !assert.NoError(t, err) {
			return
		}
		assert.NoError(t, tap.SetBridge("hpvbr0"))
		assert.Equal(t, brl.Attrs().Index, masterOf(t, "hpvb0"), "the TAP's master")
		assert.NoError(t, CheckBridge("hpvb0", "hpvbr0"), "a TAP already on the bridge")
		assert.NoError(t, tap.Close())
		assert.False(t, exists(t, "hpvb0"), "the TAP is gone after Close")

		// A TAP someone else made, not on the bridge: left alone.
		if out, err := exec.Command("ip", "tuntap", "add", "dev", "hpvb2", "mode", "tap").CombinedOutput(); err != nil {
			t.Errorf("ip tuntap add: %v: %s", err, out)
			return
		}
		assert.ErrorContains(t, CheckBridge("hpvb2", "hpvbr0"), "tap hpvb2 exists and is not on bridge hpvbr0: hpcvmm attaches only a TAP it creates")
		other, err := OpenTAP("hpvb2", 1)
		if assert.NoError(t, err) {
			assert.ErrorContains(t, other.SetBridge("hpvbr0"), "hpcvmm did not create it")
			other.Close()
		}
		assert.Zero(t, masterOf(t, "hpvb2"), "a TAP hpcvmm did not create was moved")
	})
}

// TestTAPOnBridgeKilled: the TAP a SIGKILLed process created and put on
// the bridge disappears, so the bridge is left as it was.
func TestTAPOnBridgeKilled(t *testing.T) {
	inNetns(t, func() {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "hpvbr0"}}
		if !assert.NoError(t, netlink.LinkAdd(br)) {
			return
		}
		// Started from this locked thread, the child shares its namespace.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), bridgeChildEnv+"=1")
		out, err := cmd.StdoutPipe()
		if !assert.NoError(t, err) {
			return
		}
		if !assert.NoError(t, cmd.Start()) {
			return
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		assert.NoError(t, err)
		assert.Equal(t, "ready\n", line)
		brl, _ := netlink.LinkByName("hpvbr0")
		assert.Equal(t, brl.Attrs().Index, masterOf(t, "hpvb1"), "the child's TAP is on the bridge")
		assert.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		cmd.Wait()
		assert.Eventually(t, func() bool { return !exists(t, "hpvb1") }, 5*time.Second, 10*time.Millisecond, "the killed process's TAP is still there")
		links, err := netlink.LinkList()
		assert.NoError(t, err)
		for _, l := range links {
			assert.NotEqual(t, brl.Attrs().Index, l.Attrs().MasterIndex, "%s is still on the bridge", l.Attrs().Name)
		}
	})
}
