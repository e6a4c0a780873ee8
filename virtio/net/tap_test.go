package net

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// inNetns runs f on a locked OS thread inside a network namespace of its
// own, so nothing touches the host's interfaces. The thread is never
// unlocked: it exits with the goroutine, namespace and all. f reports
// through assert (require's FailNow must stay on the test goroutine).
func inNetns(t *testing.T, f func()) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace and TAP interfaces")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP driver: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare(CLONE_NEWNET): %v", err)
			return
		}
		f()
	}()
	<-done
}

func exists(t *testing.T, name string) bool {
	ok, err := uapi.InterfaceExists(name)
	assert.NoError(t, err)
	return ok
}

func TestTAPCreateAttachAndErrors(t *testing.T) {
	inNetns(t, func() {
		// Absent: created, up, removed on Close.
		tap, err := OpenTAP("hpvt0", 2)
		if !assert.NoError(t, err) {
			return
		}
		assert.True(t, tap.Created())
		assert.True(t, exists(t, "hpvt0"))
		mtu, err := tap.MTU()
		assert.NoError(t, err)
		assert.Equal(t, 1500, mtu)
		assert.Len(t, tap.QueueFDs(), 2)
		assert.NoError(t, tap.EnableQueue(1, false))
		assert.NoError(t, tap.EnableQueue(1, true))
		assert.NoError(t, tap.SetOffload(uapi.TunFCsum|uapi.TunFTSO4|uapi.TunFTSO6|uapi.TunFTSOECN|uapi.TunFUFO))
		assert.NoError(t, tap.Close())
		assert.False(t, exists(t, "hpvt0"), "the TAP hpcvmm created is gone after Close")

		// Busy: a single-queue TAP has one user.
		a, err := OpenTAP("hpvt1", 1)
		if !assert.NoError(t, err) {
			return
		}
		_, err = OpenTAP("hpvt1", 1)
		assert.ErrorIs(t, err, unix.EBUSY)
		assert.ErrorContains(t, err, "busy")
		a.Close()

		// A name taken by another kind of interface.
		_, err = OpenTAP("lo", 1)
		assert.ErrorContains(t, err, "not a TAP interface")

		// Pre-existing persistent TAP: attached, left in place.
		if out, err := exec.Command("ip", "tuntap", "add", "dev", "hpvt2", "mode", "tap").CombinedOutput(); err != nil {
			t.Logf("skipping the pre-existing TAP case: ip tuntap add: %v: %s", err, out)
		} else {
			b, err := OpenTAP("hpvt2", 1)
			if assert.NoError(t, err) {
				assert.False(t, b.Created())
				b.Close()
				assert.True(t, exists(t, "hpvt2"), "a TAP hpcvmm did not create stays")
			}
			_, err = OpenTAP("hpvt2", 2)
			assert.ErrorContains(t, err, "multi_queue")
		}

		_, err = OpenTAP("this-name-is-too-long", 1)
		assert.ErrorContains(t, err, "at most 15")

		// Without CAP_NET_ADMIN a missing TAP cannot be created.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var caps [2]unix.CapUserData
		if !assert.NoError(t, unix.Capget(&hdr, &caps[0])) {
			return
		}
		caps[0].Effective &^= 1 << unix.CAP_NET_ADMIN
		if !assert.NoError(t, unix.Capset(&hdr, &caps[0])) {
			return
		}
		_, err = OpenTAP("hpvt3", 1)
		assert.ErrorIs(t, err, unix.EPERM)
		assert.ErrorContains(t, err, "CAP_NET_ADMIN")
		assert.ErrorContains(t, err, "ip tuntap add dev hpvt3 mode tap")
	})
}

// TestTAPTraffic runs the userspace data path against a real TAP: frames
// the guest transmits arrive on the interface (seen by a packet socket),
// and frames sent on the interface land in the guest's receive buffers.
func TestTAPTraffic(t *testing.T) {
	inNetns(t, func() {
		tap, err := OpenTAP("hpvt4", 1)
		if !assert.NoError(t, err) {
			return
		}
		defer tap.Close()
		r := newPairRig(t, FeatureMrgRxbuf|FeatureCsum|FeatureGuestCsum, 64)
		r.p.tap = tap.QueueFDs()[0]
		const etherType = 0x88b5 // local experimental: nothing else sends it
		ps, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if !assert.NoError(t, err) {
			return
		}
		defer unix.Close(ps)
		idx := ifIndex(t, "hpvt4")
		assert.NoError(t, unix.Bind(ps, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx}))
		assert.NoError(t, unix.SetsockoptTimeval(ps, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}))

		// Guest → host.
		f := frame(1000, 3)
		r.putTx(0, rigBufs, Header{}, f)
		_, err = r.p.transmit()
		assert.NoError(t, err)
		assert.Equal(t, uint64(1), r.p.stats.txPackets.Load())
		buf := make([]byte, 4096)
		got := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(ps, buf, 0)
			if err != nil {
				break
			}
			if n == len(f) && bytes.Equal(buf[:n], f) {
				got = true
				break
			}
		}
		assert.True(t, got, "the guest's frame reached the TAP interface")

		// Host → guest.
		r.postRx(0, 8, 2048, rigBufs+0x10000)
		out := frame(700, 9)
		copy(out[6:12], []byte{0x02, 0, 0, 0, 0, 9})
		_, err = unix.Write(ps, out)
		assert.NoError(t, err)
		found := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !found; {
			_, err := r.p.receive()
			if !assert.NoError(t, err) {
				return
			}
			for {
				id, n, ok := r.rx.NextUsed()
				if !ok {
					break
				}
				b := r.mem[rigBufs+0x10000+uint64(id)*2048:][:n]
				if len(b) >= HeaderSize+14 && binary.BigEndian.Uint16(b[HeaderSize+12:]) == etherType {
					assert.True(t, bytes.Equal(out, b[HeaderSize:]), "received frame differs")
					assert.Equal(t, uint16(1), le16(b[10:]), "num_buffers")
					found = true
				}
			}
			time.Sleep(time.Millisecond)
		}
		assert.True(t, found, "the frame sent on the TAP reached the guest's receive buffers")
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func ifIndex(t *testing.T, name string) int {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if !assert.NoError(t, err) {
		return 0
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if !assert.NoError(t, err) {
		return 0
	}
	assert.NoError(t, unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr))
	return int(ifr.Uint32())
}

// TestTapOpenErrorTunDeviceClosed: a /dev/net/tun the user may not open (a
// host without udev's rule, as the nested test bed's L1 was) is named as
// such, not taken for a TAP the user may not attach to, whose fix (recreate
// the TAP) would change nothing.
func TestTapOpenErrorTunDeviceClosed(t *testing.T) {
	dev := tapOpenError("hpvm9n1", 1, true, fmt.Errorf("%w: %w", uapi.ErrOpenTunDevice, unix.EACCES))
	assert.ErrorContains(t, dev, "tap hpvm9n1: this user may not open /dev/net/tun")
	assert.ErrorContains(t, dev, "chmod 0666 /dev/net/tun")
	assert.ErrorIs(t, dev, unix.EACCES)
	owner := tapOpenError("hpvm9n1", 1, true, fmt.Errorf("tun: TUNSETIFF: %w", unix.EPERM))
	assert.ErrorContains(t, owner, "exists but this user may not attach to it")
	assert.NotContains(t, owner.Error(), "/dev/net/tun")
}
