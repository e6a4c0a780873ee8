//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

const (
	netPeer    = "10.77.0.1"
	netGuest   = "10.77.0.2"
	netMiB     = 16
	netTimeout = 8 * time.Minute
)

// inPrivateNetns moves the calling test goroutine's thread into a network
// namespace of its own for the rest of the (sub)test: hpcvmm started from
// it (fork inherits the thread's namespace), the TAP hpcvmm creates and the
// sockets the test opens all live there, so neither L1's nor the host's
// interfaces are touched. The thread is never unlocked: it exits with the
// goroutine and takes the namespace with it.
func inPrivateNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace and a TAP")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP driver: %v", err)
	}
	runtime.LockOSThread()
	require.NoError(t, unix.Unshare(unix.CLONE_NEWNET), "unshare(CLONE_NEWNET)")
	ipCmd(t, "link", "set", "lo", "up")
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// configureTAP waits for hpcvmm to create the TAP, then gives it L1's
// address and brings it up.
func configureTAP(t *testing.T, vm *harness.VMProcess, name, addr string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := net.InterfaceByName(name); err == nil {
			break
		}
		require.False(t, vm.Exited(), "hpcvmm exited before creating TAP %s", name)
		require.True(t, time.Now().Before(deadline), "TAP %s did not appear", name)
		time.Sleep(20 * time.Millisecond)
	}
	ipCmd(t, "addr", "add", addr+"/24", "dev", name)
	ipCmd(t, "link", "set", name, "up")
}

func netCmdline(extra string) string {
	return "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=net " + extra
}

// TestNetworkPingAndTransfer: the guest's stock virtio_net binds to the
// device on a TAP hpcvmm creates in L1, pings L1's end of the TAP, sends 16
// MiB over TCP to L1 and receives 16 MiB back, with equal SHA-256 sums on
// both ends; with vhost-net and with the userspace data path.
func TestNetworkPingAndTransfer(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		for _, vhost := range []string{"on", "off"} {
			t.Run("vhost="+vhost, func(t *testing.T) {
				if _, err := os.Stat("/dev/vhost-net"); vhost == "on" && err != nil {
					t.Skipf("no vhost-net here: %v", err)
				}
				inPrivateNetns(t)
				const tap = "hpvnet0"
				lnRx, err := net.Listen("tcp", "0.0.0.0:5001")
				require.NoError(t, err)
				defer lnRx.Close()
				lnTx, err := net.Listen("tcp", "0.0.0.0:5002")
				require.NoError(t, err)
				defer lnTx.Close()
				payload := make([]byte, netMiB<<20)
				for i := 0; i < len(payload); i += 8 {
					v := rand.Uint64()
					for k := 0; k < 8; k++ {
						payload[i+k] = byte(v >> (8 * k))
					}
				}
				sum := sha256.Sum256(payload)
				wantRx := hex.EncodeToString(sum[:])

				start := time.Now()
				vm := env.StartVM(t, "run",
					"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
					"--cmdline", netCmdline(fmt.Sprintf("hpcvmm.net_addr=%s hpcvmm.net_peer=%s hpcvmm.net_mib=%d", netGuest, netPeer, netMiB)),
					"--cpus", "1", "--memory", "768M", "--hugepages", "none",
					"--net", "tap="+tap+",vhost="+vhost,
				)
				configureTAP(t, vm, tap, netPeer)

				// Guest → L1: read exactly what the guest sends, then close,
				// which ends the guest's nc.
				type result struct {
					sum string
					n   int64
					d   time.Duration
					err error
				}
				rxDone := make(chan result, 1)
				go func() {
					c, err := acceptWithin(lnRx, netTimeout)
					if err != nil {
						rxDone <- result{err: err}
						return
					}
					defer c.Close()
					h := sha256.New()
					t0 := time.Now()
					n, err := io.CopyN(h, c, netMiB<<20)
					rxDone <- result{sum: hex.EncodeToString(h.Sum(nil)), n: n, d: time.Since(t0), err: err}
				}()
				txDone := make(chan result, 1)
				go func() {
					c, err := acceptWithin(lnTx, netTimeout)
					if err != nil {
						txDone <- result{err: err}
						return
					}
					t0 := time.Now()
					n, err := c.Write(payload)
					c.Close()
					txDone <- result{n: int64(n), d: time.Since(t0), err: err}
				}()

				rx := <-rxDone
				require.NoError(t, rx.err, "guest → L1 transfer")
				tx := <-txDone
				require.NoError(t, tx.err, "L1 → guest transfer")
				require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
				g := vm.GuestResults()
				assert.Equal(t, "virtio_net", g["net_eth0_driver"])
				assert.Equal(t, "ok", g["net_ping"])
				assert.Equal(t, g["net_tx_sha256"], rx.sum, "guest → L1: checksums of what the guest sent and L1 received")
				assert.Equal(t, wantRx, g["net_rx_sha256"], "L1 → guest: checksums of what L1 sent and the guest received")
				assert.Equal(t, strconv.Itoa(netMiB<<20), g["net_rx_bytes"])
				_, err = net.InterfaceByName(tap)
				assert.Error(t, err, "the TAP hpcvmm created is removed when it exits")

				env.Record(t, "guest_to_l1_MiBps", fmt.Sprintf("%.2f", float64(netMiB)/rx.d.Seconds()))
				env.Record(t, "l1_to_guest_MiBps", fmt.Sprintf("%.2f", float64(netMiB)/tx.d.Seconds()))
				env.Record(t, "guest_tx_seconds", g["net_tx_seconds"])
				env.Record(t, "guest_rx_seconds", g["net_rx_seconds"])
				env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
				// The guest's virtio interrupt counts after both transfers
				// (/proc/interrupts): how often the data path interrupted it.
				var irqs []string
				for k, v := range g {
					if strings.HasPrefix(k, "irq_") {
						irqs = append(irqs, k+"="+v)
					}
				}
				sort.Strings(irqs)
				env.Record(t, "guest_interrupts", strings.Join(irqs, " "))
			})
		}
	})
}

// TestNetworkTwoInterfacesMultiqueue: --net twice gives the guest two
// interfaces; queues=2 gives the first two queue pairs in use.
func TestNetworkTwoInterfacesMultiqueue(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		inPrivateNetns(t)
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", netCmdline(fmt.Sprintf("hpcvmm.net_addr=%s hpcvmm.net_peer=%s", netGuest, netPeer)),
			"--cpus", "2", "--memory", "512M", "--hugepages", "none",
			"--net", "tap=hpvmq0,queues=2,mac=02:68:70:00:00:10",
			"--net", "tap=hpvsq1,vhost=off",
		)
		configureTAP(t, vm, "hpvmq0", netPeer)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		g := vm.GuestResults()
		assert.Equal(t, "eth0,eth1", g["net_ifaces"])
		assert.Equal(t, "virtio_net", g["net_eth0_driver"])
		assert.Equal(t, "virtio_net", g["net_eth1_driver"])
		assert.Equal(t, "02:68:70:00:00:10", g["net_eth0_mac"])
		assert.Equal(t, "2", g["net_eth0_rx_queues"], "queue pairs in use on the queues=2 interface")
		assert.Equal(t, "2", g["net_eth0_tx_queues"])
		assert.Equal(t, "1", g["net_eth1_rx_queues"])
		assert.Equal(t, "ok", g["net_ping"], "traffic over the multiqueue interface")
		env.Record(t, "eth0_queues", g["net_eth0_rx_queues"])
	})
}

func acceptWithin(ln net.Listener, d time.Duration) (net.Conn, error) {
	if tl, ok := ln.(*net.TCPListener); ok {
		_ = tl.SetDeadline(time.Now().Add(d))
	}
	return ln.Accept()
}
