package transport_test

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"
	"testing"

	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

// fuzzSizes are the fuzz device's queue maximum sizes: several queues of
// different sizes, so queue_select and queue_size have something to get wrong.
var fuzzSizes = []uint16{256, 16, 1}

const (
	fuzzFeatures   = 1<<0 | 1<<5 // device-specific features offered
	fuzzOffered    = fuzzFeatures | virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc
	fuzzConfigSize = 24
	fuzzVectors    = 4 // one per queue and the config vector
)

// fuzzDev is a virtio device that checks what the transport hands it: its
// configuration is only accessed inside ConfigSize, it is activated only
// with negotiated features (a subset of the offer, with VERSION_1) and one
// queue per enabled queue of the programmed size. Violations are recorded
// (the calls come under the transport's lock or from its goroutine) and
// reported by the harness.
type fuzzDev struct {
	cfg         [fuzzConfigSize]byte
	activations int
	resets      int
	active      []bool // queues given at the last activation
	sizes       []uint16
	notifies    atomic.Int64
	violation   atomic.Pointer[string]
}

func (d *fuzzDev) violate(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	d.violation.CompareAndSwap(nil, &s)
}

func (d *fuzzDev) Type() uint16            { return virtio.DeviceBlock }
func (d *fuzzDev) Features() uint64        { return fuzzFeatures }
func (d *fuzzDev) QueueMaxSizes() []uint16 { return fuzzSizes }
func (d *fuzzDev) ConfigSize() int         { return fuzzConfigSize }
func (d *fuzzDev) EventFD() int            { return -1 }
func (d *fuzzDev) HandleEvent() error      { return nil }
func (d *fuzzDev) Reset()                  { d.resets++ }
func (d *fuzzDev) ReadConfig(off int, b []byte) {
	if off < 0 || off+len(b) > fuzzConfigSize {
		d.violate("ReadConfig(%d, %d bytes) outside the %d-byte configuration", off, len(b), fuzzConfigSize)
		return
	}
	copy(b, d.cfg[off:])
}
func (d *fuzzDev) WriteConfig(off int, b []byte) {
	if off < 0 || off+len(b) > fuzzConfigSize {
		d.violate("WriteConfig(%d, %d bytes) outside the %d-byte configuration", off, len(b), fuzzConfigSize)
		return
	}
	copy(d.cfg[off:], b)
}
func (d *fuzzDev) Activate(f uint64, qs []*queue.Queue, irq virtio.Interrupter) error {
	d.activations++
	if f&^fuzzOffered != 0 || f&virtio.FeatureVersion1 == 0 {
		d.violate("activated with features %#x: not a VERSION_1 subset of %#x", f, uint64(fuzzOffered))
	}
	if len(qs) != len(fuzzSizes) {
		d.violate("activated with %d queues, the device has %d", len(qs), len(fuzzSizes))
		return nil
	}
	d.active, d.sizes = d.active[:0], d.sizes[:0]
	for i, q := range qs {
		d.active = append(d.active, q != nil)
		var n uint16
		if q != nil {
			n = q.Size()
			if n == 0 || n > fuzzSizes[i] || n&(n-1) != 0 {
				d.violate("queue %d activated with size %d (max %d)", i, n, fuzzSizes[i])
			}
		}
		d.sizes = append(d.sizes, n)
	}
	return nil
}
func (d *fuzzDev) QueueNotify(q int) error {
	if q < 0 || q >= len(fuzzSizes) {
		d.violate("QueueNotify(%d) for a queue the device does not have", q)
	}
	d.notifies.Add(1)
	return nil
}

// transportRig is FuzzRegisters' VM: one per fuzzing process, reset per input.
type transportRig struct {
	*transporttest.Rig
	dev        *fuzzDev
	regs, msix interface {
		Read(uint64, []byte)
		Write(uint64, []byte)
	}
	bar4     uint64 // where AssignBARs put BAR4
	pciCfg   uint32 // VIRTIO_PCI_CAP_PCI_CFG offset
	msixCap  uint32
	pristine [pci.ConfigSize]byte
}

func newTransportRig(tb testing.TB) *transportRig {
	d := &fuzzDev{}
	r, err := transporttest.NewRig(d, make(queuetest.Memory, 1<<20))
	if err != nil {
		tb.Fatal(err)
	}
	tr := &transportRig{Rig: r, dev: d, regs: r.T.BARHandler(transport.RegsBAR), msix: r.T.BARHandler(transport.MSIXBAR)}
	tr.bar4, _ = r.Root.BARAddress(transporttest.Slot, transport.RegsBAR)
	for _, off := range r.Cfg.FindCapabilities(transporttest.Slot, pci.CapIDVendor) {
		if r.Cfg.Read(transporttest.Slot, 0, off+3, 1) == 5 {
			tr.pciCfg = uint32(off)
		}
	}
	tr.msixCap = uint32(r.Cfg.FindCapabilities(transporttest.Slot, pci.CapIDMSIX)[0])
	if tr.pciCfg == 0 {
		tb.Fatal("no VIRTIO_PCI_CAP_PCI_CFG capability")
	}
	r.T.ConfigRead(0, tr.pristine[:])
	return tr
}

// reset returns the rig to its state after newTransportRig the way a guest
// would (device reset, MSI-X entries masked and pending bits delivered,
// MSI-X disabled, BAR4 back where it was) plus the PCI_CFG window's fields
// restored, and clears the fakes' logs.
func (r *transportRig) reset() {
	r.regs.Write(transport.CommonOffset+20, []byte{0})
	var q [8]byte
	r.T.ConfigWrite(r.msixCap+2, []byte{0, 0x80})
	for v := 0; v < fuzzVectors; v++ {
		r.msix.Write(uint64(16*v+8), q[:])
		r.msix.Write(uint64(16*v), q[:])
		binary.LittleEndian.PutUint64(q[:], 1<<32)
		r.msix.Write(uint64(16*v+8), q[:])
		binary.LittleEndian.PutUint64(q[:], 0)
	}
	r.T.ConfigWrite(r.msixCap+2, []byte{0, 0})
	for off := r.pciCfg + 4; off < r.pciCfg+20; off += 4 {
		r.T.SetUint32(int(off), binary.LittleEndian.Uint32(r.pristine[off:]))
	}
	r.T.BARMapped(transport.RegsBAR, r.bar4, true)
	r.Router.TakeLog()
	for len(r.Errors) > 0 {
		<-r.Errors
	}
	r.dev.activations, r.dev.resets = 0, 0
	r.dev.violation.Store(nil)
	r.dev.cfg = [fuzzConfigSize]byte{}
}

func (r *transportRig) read(off uint64, n int) uint32 {
	var b [4]byte
	r.regs.Read(off, b[:n])
	return binary.LittleEndian.Uint32(b[:])
}

func (r *transportRig) write(off uint64, n int, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	r.regs.Write(off, b[:n])
}

// check reads the whole register file as a driver would and verifies the
// virtio 1.x invariants; it restores queue_select.
func (r *transportRig) check(t testing.TB, activationsBefore int) {
	if v := r.dev.violation.Load(); v != nil {
		t.Fatal(*v)
	}
	status := uint8(r.read(transport.CommonOffset+20, 1))
	// Bits the driver wrote that the spec leaves undefined read back as
	// written (Linux writes the status read-modify-write): not checked.
	if status&virtio.StatusDriverOK != 0 && status&virtio.StatusFeaturesOK == 0 {
		t.Fatalf("device_status %#x: DRIVER_OK without FEATURES_OK", status)
	}
	sel := r.read(transport.CommonOffset+8, 4)
	r.write(transport.CommonOffset+8, 4, 0)
	drv := uint64(r.read(transport.CommonOffset+12, 4))
	r.write(transport.CommonOffset+8, 4, 1)
	drv |= uint64(r.read(transport.CommonOffset+12, 4)) << 32
	r.write(transport.CommonOffset+8, 4, sel)
	if status&virtio.StatusFeaturesOK != 0 && (drv&^fuzzOffered != 0 || drv&virtio.FeatureVersion1 == 0) {
		t.Fatalf("FEATURES_OK accepted driver features %#x: not a VERSION_1 subset of the offer %#x", drv, uint64(fuzzOffered))
	}
	if n := r.read(transport.CommonOffset+18, 2); n != uint32(len(fuzzSizes)) {
		t.Fatalf("num_queues %d", n)
	}
	if v := r.read(transport.CommonOffset+16, 2); v != virtio.NoVector && v >= fuzzVectors {
		t.Fatalf("config_msix_vector %d: neither NO_VECTOR nor one of the %d vectors", v, fuzzVectors)
	}
	qsel := r.read(transport.CommonOffset+22, 2)
	activated := r.dev.activations != activationsBefore
	for q := uint32(0); q < uint32(len(fuzzSizes))+1; q++ {
		r.write(transport.CommonOffset+22, 2, q)
		size := uint16(r.read(transport.CommonOffset+24, 2))
		vec := r.read(transport.CommonOffset+26, 2)
		en := r.read(transport.CommonOffset+28, 2)
		if q == uint32(len(fuzzSizes)) {
			if size != 0 || en != 0 || vec != virtio.NoVector {
				t.Fatalf("absent queue %d reads size %d enable %d vector %#x", q, size, en, vec)
			}
			continue
		}
		if en > 1 {
			t.Fatalf("queue %d queue_enable %d", q, en)
		}
		if vec != virtio.NoVector && vec >= fuzzVectors {
			t.Fatalf("queue %d msix_vector %d: neither NO_VECTOR nor one of the %d vectors", q, vec, fuzzVectors)
		}
		if no := r.read(transport.CommonOffset+30, 2); no != q {
			t.Fatalf("queue %d queue_notify_off %d", q, no)
		}
		if en == 1 {
			// An enabled queue passed queue.New: a power-of-two size within
			// the maximum and rings aligned as the spec requires.
			desc := uint64(r.read(transport.CommonOffset+32, 4)) | uint64(r.read(transport.CommonOffset+36, 4))<<32
			avail := uint64(r.read(transport.CommonOffset+40, 4)) | uint64(r.read(transport.CommonOffset+44, 4))<<32
			used := uint64(r.read(transport.CommonOffset+48, 4)) | uint64(r.read(transport.CommonOffset+52, 4))<<32
			if size == 0 || size > fuzzSizes[q] || bits.OnesCount16(size) != 1 || desc%16 != 0 || avail%2 != 0 || used%4 != 0 {
				t.Fatalf("queue %d enabled with size %d (max %d), rings %#x/%#x/%#x", q, size, fuzzSizes[q], desc, avail, used)
			}
		}
		if activated && (en == 1) != r.dev.active[q] {
			t.Fatalf("activation gave queue %d: %v, but queue_enable is %d", q, r.dev.active[q], en)
		}
		if activated && r.dev.active[q] && r.dev.sizes[q] != size {
			t.Fatalf("activation gave queue %d of size %d, queue_size reads %d", q, r.dev.sizes[q], size)
		}
	}
	r.write(transport.CommonOffset+22, 2, qsel)
	if activated && status&virtio.StatusDriverOK == 0 {
		t.Fatalf("device activated but device_status %#x has no DRIVER_OK", status)
	}
	// MSI-X table: only valid values read back.
	var e [16]byte
	for v := 0; v < fuzzVectors; v++ {
		r.msix.Read(uint64(16*v), e[:8])
		r.msix.Read(uint64(16*v+8), e[8:])
		if e[0]&3 != 0 || binary.LittleEndian.Uint32(e[12:])&^1 != 0 {
			t.Fatalf("MSI-X entry %d reads %x: reserved bits set", v, e)
		}
	}
}

// FuzzRegisters drives the virtio-pci register file as a hostile driver:
// common configuration writes and reads of every width at every offset
// (feature selects, status, queue selection and layout, vectors, enable),
// ISR and device configuration accesses, doorbell writes, MSI-X table
// writes and enable/mask changes, the VIRTIO_PCI_CAP_PCI_CFG window into
// both BARs from configuration space, BAR4 moves (ioeventfds follow),
// device-side interrupts, and macro steps a real driver would take
// (negotiate, set up a queue over guest memory, DRIVER_OK). One rig per
// fuzzing process, reset per input through the guest interface.
//
// After every step it asserts the spec's invariants as a driver reads
// them: device_status never has DRIVER_OK without FEATURES_OK; accepted driver features are a VERSION_1 subset of the offer;
// num_queues is fixed; every vector register holds NO_VECTOR or a vector of
// the table; an absent queue reads size 0, disabled, NO_VECTOR; an enabled
// queue has a power-of-two size within its maximum and aligned rings;
// queue_notify_off is the queue index; the ISR has only bits 0-1; MSI-X
// entries read back with reserved bits clear; the device's configuration is
// only accessed inside its size; and the device is activated only on
// DRIVER_OK, with the negotiated features and exactly the enabled queues at
// their programmed sizes. After the input, the ioeventfds sit exactly on
// the doorbells of wherever BAR4 is mapped.
func FuzzRegisters(f *testing.F) {
	op := func(kind byte, off uint16, width byte, v uint32) []byte {
		b := []byte{kind, byte(off), byte(off >> 8), width, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[4:], v)
		return b
	}
	cat := func(ops ...[]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o...)
		}
		return b
	}
	// A well-behaved driver: negotiate, set up queue 0, DRIVER_OK, kick.
	f.Add(cat(op(8, 0, 0, 0), op(9, 0, 0, 0), op(9, 1, 0, 1), op(10, 0, 0, 0), op(1, transport.NotifyOffset, 2, 0), op(7, 0, 0, 0)))
	// Byte-wise feature and address writes, queue_select out of range, status games.
	f.Add(cat(op(0, 20, 1, 3), op(0, 8, 1, 1), op(0, 15, 1, 1), op(0, 20, 1, 0xb), op(0, 22, 2, 7), op(0, 24, 2, 4),
		op(0, 22, 2, 1), op(0, 24, 2, 8), op(0, 33, 1, 0x10), op(0, 28, 2, 1), op(0, 20, 1, 0xf)))
	// PCI_CFG window: bar 4, offset 20 (status), length 1, then write data.
	f.Add(cat(op(4, 4, 1, 4), op(4, 8, 4, 20), op(4, 12, 4, 1), op(4, 16, 1, 3), op(5, 16, 4, 0), op(4, 4, 1, 1), op(4, 8, 4, 0x800)))
	// MSI-X programmed, vectors assigned, BAR4 moved and unmapped.
	f.Add(cat(op(3, 0, 2, 0xfee00000), op(3, 12, 2, 0), op(11, 0, 0, 0x8000), op(0, 16, 2, 0), op(0, 26, 2, 3),
		op(7, 1, 0, 0), op(6, 0, 0, 0x123456), op(6, 1, 0, 0)))

	r := newTransportRig(f)
	f.Fuzz(func(t *testing.T, ops []byte) { fuzzRegisters(t, r, ops) })
}

func fuzzRegisters(t testing.TB, r *transportRig, ops []byte) {
	{
		r.reset()
		widths := [...]int{1, 2, 4, 8, 0, 3, 4, 2}
		var buf [8]byte
		for len(ops) >= 8 {
			kind, off, w := ops[0]%12, uint64(binary.LittleEndian.Uint16(ops[1:])), widths[ops[3]%8]
			v := binary.LittleEndian.Uint32(ops[4:])
			ops = ops[8:]
			binary.LittleEndian.PutUint32(buf[:], v)
			binary.LittleEndian.PutUint32(buf[4:], ^v)
			before := r.dev.activations
			switch kind {
			case 0: // common configuration write
				r.regs.Write(transport.CommonOffset+off%64, buf[:w])
			case 1: // anywhere in BAR4 and past it: ISR, device config, doorbells
				r.regs.Write(off%(transport.RegsBARSize+0x100), buf[:w])
			case 2: // reads; reading the ISR acknowledges it, so only here
				o := off % (transport.RegsBARSize + 0x100)
				r.regs.Read(o, buf[:w])
				if o == transport.ISROffset && w > 0 && (buf[0]&^3 != 0 || w > 1 && buf[1] != 0) {
					t.Fatalf("ISR reads %x: bits beyond queue and config interrupts", buf[:w])
				}
			case 3: // MSI-X table and PBA
				r.msix.Write(off%transport.MSIXBARSize, buf[:w])
			case 4: // PCI_CFG capability fields (bar, offset, length, data)
				r.T.ConfigWrite(r.pciCfg+uint32(off%20), buf[:min(w, 4)])
			case 5:
				r.T.ConfigRead(r.pciCfg+uint32(off%20), buf[:min(w, 4)])
			case 6: // BAR4 moved or decode toggled
				r.T.BARMapped(transport.RegsBAR, uint64(v)<<12, off&1 == 0)
			case 7: // device side
				if off&1 == 0 {
					r.T.SignalQueue(int(v%4) - 1)
				} else {
					r.T.ConfigChanged()
				}
			case 8: // macro: reset, ACKNOWLEDGE, DRIVER, features (v picks), FEATURES_OK
				r.Negotiate(fuzzOffered &^ (uint64(v&0xff) << 28) &^ uint64(v>>8&0x21))
			case 9: // macro: queue off%4 over valid guest memory, vector v
				q := int(off % 4)
				size := uint16(1)
				if q < len(fuzzSizes) {
					size = fuzzSizes[q] >> (v >> 16 % 4)
				}
				r.SetupQueue(q, queuetest.NewDriver(r.Mem, max(size, 1), 0x10000*uint64(1+q)), uint16(v))
			case 10: // macro: DRIVER_OK
				r.DriverOK()
			case 11: // MSI-X message control
				r.T.ConfigWrite(r.msixCap+2+uint32(off%2), buf[:min(w, 2)])
			}
			r.check(t, before)
		}
		// ioeventfds: one per queue on BAR4's doorbells, wherever BAR4 is.
		n := r.Notifier.Len()
		if n != 0 && n != len(fuzzSizes) {
			t.Fatalf("%d ioeventfds for %d queues", n, len(fuzzSizes))
		}
		for _, e := range r.Notifier.Events {
			if e.Length != transport.NotifyWidth || (e.Addr-transport.NotifyOffset)%transport.NotifyMultiple != 0 {
				t.Fatalf("ioeventfd at %#x length %d: not a doorbell", e.Addr, e.Length)
			}
		}
	}
}
