package queue_test

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// suppressModel is the reference for notification suppression, written
// from the virtio 1.x spec (2.7.7.2, 2.7.10) one used entry at a time
// rather than with vring_need_event's modular arithmetic: with EVENT_IDX
// the device must notify when it writes the used entry at index used_event
// (the used index stepping from used_event to used_event+1) and should not
// otherwise; without it, it notifies unless VIRTQ_AVAIL_F_NO_INTERRUPT is
// set.
func suppressModel(eventIdx bool, old, cur, usedEvent, availFlags uint16) bool {
	if old == cur {
		return false
	}
	if !eventIdx {
		return availFlags&queue.AvailFlagNoInterrupt == 0
	}
	for i := old; i != cur; i++ {
		if i == usedEvent {
			return true
		}
	}
	return false
}

// runSuppressionModel drives one queue with the operations encoded in ops
// (a hostile driver: used_event, flags and the avail index are arbitrary)
// and checks after every batch that NeedInterrupt says exactly what the
// model says, and that EnableNotify/DisableNotify leave the fields the
// spec asks for. It returns a description of the first difference.
func runSuppressionModel(t *testing.T, ops []byte) {
	if len(ops) < 4 {
		return
	}
	eventIdx := ops[0]&1 != 0
	size := uint16(1) << (ops[0] >> 1 % 9) // 1..256
	start := binary.LittleEndian.Uint16(ops[1:])
	ops = ops[3:]
	var features uint64
	if eventIdx {
		features = queue.FeatureEventIdx
	}
	mem := make(queuetest.Memory, 1<<16)
	d := queuetest.NewDriver(mem, size, 0x1000)
	// Both indices start anywhere, wrap included, as after a long run.
	binary.LittleEndian.PutUint16(mem[d.UsedAt+2:], start)
	d.SetAvailIdx(start)
	q, err := queue.New(mem, d.Config(), features)
	require.NoError(t, err)
	for h := range size {
		d.Chain(d.DescAddr, h, []queuetest.Buf{{Addr: 0x8000, Len: 1}})
	}
	c := queue.NewChain(int(size))
	usedEvent, flags := uint16(0), uint16(0)
	old := start // used index at the last interrupt decision
	for len(ops) >= 3 {
		op, a, b := ops[0], ops[1], ops[2]
		ops = ops[3:]
		switch op % 6 {
		case 0: // the driver makes up to a entries available
			for range a {
				if availIdx(d)-d.UsedIdx() >= size {
					break // a full ring: the driver has no free entry
				}
				d.Publish(uint16(b) % size)
			}
		case 1: // the driver writes used_event (anything: it is untrusted)
			usedEvent = uint16(a) | uint16(b)<<8
			if b&1 == 0 {
				// Mostly near the used index, where the decisions are.
				usedEvent = d.UsedIdx() + uint16(int8(a)%8)
			}
			d.SetUsedEvent(usedEvent)
		case 2: // the driver writes the avail flags (any bits)
			flags = uint16(a) | uint16(b)<<8
			d.SetAvailFlags(flags)
		case 3: // the device uses up to a entries, then decides once
			for range a {
				ok, err := q.Pop(c)
				require.NoError(t, err)
				if !ok {
					break
				}
				require.NoError(t, q.Push(c.Head, 0))
			}
			cur := d.UsedIdx()
			want := suppressModel(eventIdx, old, cur, usedEvent, flags)
			if b&1 != 0 {
				// Asking without deciding changes nothing.
				require.Equal(t, want, q.InterruptDue(), "InterruptDue")
				require.Equal(t, want, q.InterruptDue(), "InterruptDue again")
			}
			got := q.NeedInterrupt()
			require.Equal(t, want, got, "EVENT_IDX %v: used index %d -> %d, used_event %d, flags %#x", eventIdx, old, cur, usedEvent, flags)
			old = cur
		case 4: // the device stops processing: re-arm and re-check
			more := q.EnableNotify()
			assert.Equal(t, availIdx(d) != q.LastAvail(), more, "EnableNotify's re-check")
			if eventIdx {
				// The driver must kick when it adds the entry at
				// avail_event: the next one the device will read.
				require.Equal(t, q.LastAvail(), d.AvailEvent(), "avail_event after EnableNotify")
			} else {
				require.Zero(t, d.UsedFlags()&queue.UsedFlagNoNotify, "NO_NOTIFY after EnableNotify")
			}
		case 5: // the device starts processing
			before := d.AvailEvent()
			q.DisableNotify()
			if eventIdx {
				// A stale avail_event already suppresses kicks; the
				// device writes nothing.
				require.Equal(t, before, d.AvailEvent(), "avail_event after DisableNotify")
			} else {
				require.NotZero(t, d.UsedFlags()&queue.UsedFlagNoNotify, "NO_NOTIFY after DisableNotify")
			}
		}
	}
}

func availIdx(d *queuetest.Driver) uint16 { return binary.LittleEndian.Uint16(d.Mem[d.Avail+2:]) }

// TestNeedInterruptFollowsSpec runs the model on random operation
// sequences: every interrupt the spec requires is raised and none other,
// across index wrap-around and hostile used_event and flags values.
func TestNeedInterruptFollowsSpec(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		ops := make([]byte, 3+3*r.IntN(64))
		for i := range ops {
			ops[i] = byte(r.Uint32())
		}
		runSuppressionModel(t, ops)
	}
}

// FuzzNotificationSuppression is TestNeedInterruptFollowsSpec's model
// with the operation sequence from the fuzzer.
func FuzzNotificationSuppression(f *testing.F) {
	f.Add([]byte{1, 0xfe, 0xff, 0, 4, 0, 1, 0xff, 0xff, 3, 2, 0, 3, 2, 0})
	f.Add([]byte{0x11, 0, 0, 0, 200, 0, 2, 1, 0, 3, 255, 0, 4, 0, 0, 5, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 3, 0, 2, 1, 0, 3, 1, 0, 2, 0, 0, 3, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*512 {
			return
		}
		runSuppressionModel(t, ops)
	})
}

// atomicDriver is a guest driver running concurrently with the device, with
// Linux's protocol (drivers/virtio/virtio_ring.c, split rings) and every
// ring field the device reads or writes accessed atomically, as a guest's
// barriered accesses are.
type atomicDriver struct {
	*queuetest.Driver
	eventIdx bool
	avail    uint16 // shadow of avail.idx
	lastUsed uint16
}

func (d *atomicDriver) load(off uint64) uint16     { return uapi.AtomicLoadUint16(d.Mem, off) }
func (d *atomicDriver) store(off uint64, v uint16) { uapi.AtomicStoreUint16(d.Mem, off, v) }

// add publishes head and reports whether the device asked for a kick
// (virtqueue_kick_prepare: the index store, a full barrier, then the
// device's avail_event or flags).
func (d *atomicDriver) add(head uint16) (kick bool) {
	old := d.avail
	d.store(d.Avail+4+2*uint64(old%d.Size), head)
	d.avail++
	d.store(d.Avail+2, d.avail)
	if d.eventIdx {
		ev := d.load(d.UsedAt + 4 + 8*uint64(d.Size))
		return uint16(d.avail-ev-1) < uint16(d.avail-old)
	}
	return d.load(d.UsedAt)&queue.UsedFlagNoNotify == 0
}

// reclaim takes every used entry and returns how many.
func (d *atomicDriver) reclaim() int {
	n := 0
	for d.lastUsed != d.load(d.UsedAt+2) {
		d.lastUsed++
		n++
	}
	return n
}

// enableCB asks for an interrupt at the next used entry and reports whether
// entries arrived meanwhile (virtqueue_enable_cb: store, barrier, re-check).
func (d *atomicDriver) enableCB() (pending bool) {
	if d.eventIdx {
		d.store(d.Avail+4+2*uint64(d.Size), d.lastUsed)
	} else {
		d.store(d.Avail, 0)
	}
	return d.load(d.UsedAt+2) != d.lastUsed
}

// disableCB turns interrupts off again (without EVENT_IDX; with it Linux
// leaves used_event stale, which suppresses them as well).
func (d *atomicDriver) disableCB() {
	if !d.eventIdx {
		d.store(d.Avail, queue.AvailFlagNoInterrupt)
	}
}

// TestNoLostWakeups runs a driver and the device concurrently, as a guest
// vCPU and the device goroutine do, with kicks and interrupts as one-slot
// channels (eventfds). The driver keeps the ring full and sleeps on the
// interrupt only after re-arming it and re-checking; the device sleeps on
// the kick only after EnableNotify's re-check. A wakeup lost on either side
// (a missed interrupt or kick) leaves both asleep: the test fails on a
// timeout instead of finishing.
func TestNoLostWakeups(t *testing.T) {
	total := 200000
	if testing.Short() {
		total = 20000
	}
	for _, eventIdx := range []bool{true, false} {
		name := map[bool]string{true: "event_idx", false: "flags"}[eventIdx]
		t.Run(name, func(t *testing.T) {
			var features uint64
			if eventIdx {
				features = queue.FeatureEventIdx
			}
			mem := make(queuetest.Memory, 1<<16)
			qd := queuetest.NewDriver(mem, 8, 0x1000)
			for h := range uint16(8) {
				qd.Chain(qd.DescAddr, h, []queuetest.Buf{{Addr: 0x8000, Len: 1}})
			}
			d := &atomicDriver{Driver: qd, eventIdx: eventIdx}
			q, err := queue.New(mem, qd.Config(), features)
			require.NoError(t, err)
			d.disableCB()

			kick, intr := make(chan struct{}, 1), make(chan struct{}, 1)
			stop := make(chan struct{})
			var kicks, irqs, used int
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // the device goroutine
				defer wg.Done()
				c := queue.NewChain(8)
				for {
					select {
					case <-kick:
					case <-stop:
						return
					}
					for {
						q.DisableNotify()
						for {
							ok, err := q.Pop(c)
							if err != nil {
								t.Error(err)
								return
							}
							if !ok {
								break
							}
							if err := q.Push(c.Head, 0); err != nil {
								t.Error(err)
								return
							}
							used++
						}
						if q.NeedInterrupt() {
							irqs++
							select {
							case intr <- struct{}{}:
							default:
							}
						}
						if !q.EnableNotify() {
							break
						}
					}
				}
			}()
			inflight, sent := 0, 0
			deadline := time.After(20 * time.Second)
			for {
				inflight -= d.reclaim()
				if sent == total && inflight == 0 {
					break
				}
				if sent < total && inflight < int(d.Size) {
					if d.add(uint16(sent) % d.Size) {
						kicks++
						select {
						case kick <- struct{}{}:
						default:
						}
					}
					sent++
					inflight++
					continue
				}
				// Full, or waiting for the last ones: sleep on the
				// interrupt unless entries came while re-arming.
				if d.enableCB() {
					d.disableCB()
					continue
				}
				select {
				case <-intr:
				case <-deadline:
					close(stop)
					wg.Wait()
					t.Fatalf("stuck after %d of %d requests (%d in flight, used index %d, avail index %d): a lost wakeup", sent, total, inflight, d.load(d.UsedAt+2), d.avail)
				}
				d.disableCB()
			}
			close(stop)
			wg.Wait()
			assert.Equal(t, total, used)
			t.Logf("%d requests: %d kicks, %d interrupts", total, kicks, irqs)
			// The driver arms its interrupt only when it must wait (a
			// full ring, the end); how many kicks the device's
			// suppression saves depends on the scheduling, so it is
			// only logged.
			assert.Less(t, irqs, total/2, "interrupts while the driver did not ask for them")
		})
	}
}
