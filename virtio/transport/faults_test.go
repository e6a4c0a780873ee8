package transport_test

import (
	"log/slog"
	"math/bits"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

// Guest-triggered faults: each test plays a guest that does something a
// driver must not (descriptors outside RAM, a looped chain, MSI-X garbage,
// a doorbell flood), many times over, and checks that the device refuses it
// without panicking, keeps serving a well-behaved request afterwards, and
// that the refusals reach the log the way the VMM wires them (vmm logs
// every device's OnError through platform.Refusals): one line per kind per
// interval, the rest counted.

func faultRig(t *testing.T) (*transporttest.Rig, *echoDev, *platform.Refusals, *testenv.LockedBuffer) {
	t.Helper()
	log := &testenv.LockedBuffer{} // the device goroutine writes, the test reads
	ref := platform.NewRefusals(slog.New(slog.NewTextHandler(log, nil)), time.Hour)
	d := &echoDev{}
	r, err := transporttest.NewRigReporting(d, make(queuetest.Memory, 1<<20), func(err error) { ref.Refuse("virtio-test", err) })
	require.NoError(t, err)
	t.Cleanup(func() { r.T.Close() })
	return r, d, ref, log
}

// echoWorks posts one readable buffer on a freshly activated device and
// waits for it to come back used: the device still serves a guest.
func echoWorks(t *testing.T, r *transporttest.Rig) {
	t.Helper()
	drv := activate(t, r)
	drv.Chain(drv.DescAddr, 0, []queuetest.Buf{{Addr: 0x8000, Len: 64}})
	drv.Publish(0)
	require.NoError(t, r.Kick(0))
	waitUsed(t, drv, 1)
	id, n, ok := drv.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(0), id)
	assert.Equal(t, uint32(64), n)
}

func TestGuestFaultBadChainsAreRefusedRateLimited(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	cases := []struct {
		name, want string
		chain      func(drv *queuetest.Driver)
	}{
		{"buffer outside RAM", "outside RAM", func(drv *queuetest.Driver) {
			drv.SetDesc(drv.DescAddr, 0, 1<<40, 16, 0, 0)
		}},
		{"buffer straddling the end of RAM", "outside RAM", func(drv *queuetest.Driver) {
			drv.SetDesc(drv.DescAddr, 0, 1<<20-8, 16, 0, 0)
		}},
		{"looped chain", "loop", func(drv *queuetest.Driver) {
			drv.SetDesc(drv.DescAddr, 0, 0x8000, 16, 1, 1) // NEXT -> 1
			drv.SetDesc(drv.DescAddr, 1, 0x9000, 16, 1, 0) // NEXT -> 0
		}},
		{"self loop", "loop", func(drv *queuetest.Driver) {
			drv.SetDesc(drv.DescAddr, 0, 0x8000, 16, 1, 0)
		}},
		{"next outside the table", "outside table", func(drv *queuetest.Driver) {
			drv.SetDesc(drv.DescAddr, 0, 0x8000, 16, 1, 200)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _, ref, log := faultRig(t)
			const rounds = 50
			for i := 0; i < rounds; i++ {
				drv := activate(t, r)
				c.chain(drv)
				drv.Publish(0)
				require.NoError(t, r.Kick(0))
				require.Eventually(t, func() bool { return r.Status()&virtio.StatusNeedsReset != 0 }, 2*time.Second, time.Millisecond,
					"round %d: the device did not refuse the chain with DEVICE_NEEDS_RESET", i)
				assert.Zero(t, drv.UsedIdx(), "round %d: nothing of a refused chain is returned used", i)
			}
			assert.Equal(t, uint64(rounds), ref.Count("virtio-test"), "one refusal per bad chain")
			assert.Equal(t, 1, strings.Count(log.String(), "device error"), "one log line for %d refusals in an interval:\n%s", rounds, log)
			assert.Contains(t, log.String(), c.want)
			echoWorks(t, r)
		})
	}
}

func TestGuestFaultDoorbellFlood(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	r, d, ref, log := faultRig(t)
	drv := activate(t, r)
	const flood = 100000
	start := time.Now()
	for i := 0; i < flood; i++ {
		r.KickMMIO(0) // an existing queue with nothing posted
		r.KickMMIO(7) // a queue the device does not have
	}
	elapsed := time.Since(start)
	assert.Equal(t, uint64(flood), r.T.NotifyExits(), "every doorbell to queue 0 was taken")
	// Reported at the 1st, 2nd, 4th... (no allocation per exit), logged once.
	assert.Equal(t, uint64(bits.Len(flood)), ref.Count("virtio-test"), "doorbells to queue 7 reported at powers of two")
	assert.Equal(t, 1, strings.Count(log.String(), "device error"), "one log line for the flood:\n%s", log)
	assert.Contains(t, log.String(), "doorbell for queue 7")
	// The rig's MMIO write itself allocates its buffer (it escapes through
	// the bus's device interface); a refused doorbell adds nothing to it.
	harness := testing.AllocsPerRun(1000, func() { r.KickMMIO(0) })
	refused := testing.AllocsPerRun(1000, func() { r.KickMMIO(7) })
	assert.Equal(t, harness, refused, "a refused doorbell allocates nothing between reports")
	assert.Zero(t, r.Status()&virtio.StatusNeedsReset, "a doorbell flood is no reason to fail the device")
	// The queue still works: one real request after the flood.
	drv.Chain(drv.DescAddr, 0, []queuetest.Buf{{Addr: 0x8000, Len: 32}})
	drv.Publish(0)
	r.KickMMIO(0)
	waitUsed(t, drv, 1)
	t.Logf("%d doorbells (half to a missing queue) in %v; the device ran %d notifications (coalesced by the eventfd)", 2*flood, elapsed, d.notifies.Load())
}

func TestGuestFaultMSIXGarbage(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	r, _, ref, log := faultRig(t)
	drv := activate(t, r) // vectors 0 (config) and 1 (queue 0) valid
	garbage := []struct{ lo, hi, data, ctrl uint64 }{
		{0xdeadbeef, 0, 0xffffffff, 0xfffffffe}, // outside the window, reserved control bits
		{0xfee00003, 1, 0x30, 0},                // upper half set, reserved address bits
		{0, 0, 0, 0},                            // address 0 (guest RAM)
		{0xfed00000, 0, 0x41, 0xfffffffe},       // just below the window
	}
	const rounds = 200
	for i := 0; i < rounds; i++ {
		g := garbage[i%len(garbage)]
		e := r.MSIXTable + 16 // vector 1
		r.Write(e, 4, g.lo)
		r.Write(e+4, 4, g.hi)
		r.Write(e+8, 4, g.data)
		r.Write(e+12, 4, g.ctrl)
		assert.Zero(t, r.Read(e, 4)&3, "address bits 1:0 are reserved and read zero")
		assert.Zero(t, r.Read(e+12, 4)&^1, "vector control bits 31:1 are reserved and read zero")
		// Whatever is assigned in KVM is routed into the interrupt window.
		for fd, gsi := range r.Router.IRQFDs {
			rt := r.Router.Routes[gsi]
			require.True(t, irq.ValidMSIAddress(uint64(rt.AddrHi)<<32|uint64(rt.AddrLo)),
				"round %d: irqfd %d fires GSI %d routed to %#x:%#x", i, fd, gsi, rt.AddrHi, rt.AddrLo)
		}
		if r.Read(e, 4)>>20 != 0xfee || r.Read(e+4, 4) != 0 {
			_, assigned := r.Router.Assigned(r.T.IRQFDs().EventFD(1))
			assert.False(t, assigned, "round %d: vector 1 with address %#x:%#x is left masked in KVM", i, g.hi, g.lo)
		}
	}
	assert.GreaterOrEqual(t, ref.Count("virtio-test"), uint64(rounds/2), "unmasked garbage vectors refused")
	assert.Equal(t, 1, strings.Count(log.String(), "device error"), "one log line:\n%s", log)
	assert.Contains(t, log.String(), "outside the MSI window")
	assert.Zero(t, r.Status()&virtio.StatusNeedsReset)

	// A valid message again: the queue's interrupts arrive.
	e := r.MSIXTable + 16
	r.Write(e, 4, 0xfee00000)
	r.Write(e+4, 4, 0)
	r.Write(e+8, 4, 0x31)
	r.Write(e+12, 4, 0)
	drv.Chain(drv.DescAddr, 0, []queuetest.Buf{{Addr: 0x8000, Len: 32}})
	drv.Publish(0)
	require.NoError(t, r.Kick(0))
	waitUsed(t, drv, 1)
	require.NoError(t, r.WaitInterrupt(1, 2*time.Second), "queue interrupt on the repaired vector")
}
