// Package net is the virtio-net device (virtio 1.x 5.1) over a TAP
// interface, on the modern virtio-pci transport.
//
// Queue layout: receiveq0, transmitq0, ..., receiveqN-1, transmitqN-1 and,
// with more than one pair, the control queue (VIRTIO_NET_F_CTRL_VQ +
// VIRTIO_NET_F_MQ). Pair i is backed by TAP queue i.
//
// The device implements transport.EventFDOwner and so takes every data
// queue's doorbell eventfd away from the transport's goroutine. With vhost
// (the default when /dev/vhost-net exists) it hands each pair to a kernel
// vhost-net instance: guest RAM as its memory table, the rings, the
// doorbell eventfd as the vring's kick and the MSI-X vector's irqfd eventfd
// as its call (moved along when the driver changes the queue's vector),
// the TAP queue as its backend, and its worker thread placed on
// Options.WorkerCPUs, off the pinned vCPUs' CPUs; hpcvmm is then off the
// data path. Otherwise one worker goroutine per pair moves packets between the
// rings and its TAP queue: doorbells arrive as KVM ioeventfds, interrupts
// leave as KVM irqfds (through the MSI-X masking logic), every descriptor
// is validated by virtio/queue, every transmit header by ValidateTx, and no
// packet allocates. The control queue stays on the transport's goroutine.
//
// The virtio-net header goes to and from the TAP as is (IFF_VNET_HDR,
// TUNSETVNETHDRSZ 12): checksum and segmentation offloads travel in it,
// and TUNSETOFFLOAD tells the kernel which ones the guest accepts.
package net

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	stdnet "net"
	"sync"
	"sync/atomic"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
)

// Queue sizes offered to the driver.
const (
	DataQueueSize = 256
	CtrlQueueSize = 64
	// MaxPairs is the largest number of queue pairs (the kernel's TAP
	// limit is 256; the vCPU count is the useful bound).
	MaxPairs = 64
)

// Config space layout (struct virtio_net_config) and values.
const (
	cfgMAC      = 0
	cfgStatus   = 6
	cfgMaxPairs = 8
	cfgMTU      = 10
	configSize  = 12

	statusLinkUp = 1
)

// Control queue classes, commands and acks (virtio 1.x 5.1.6.5).
const (
	ctrlClassMQ       = 4
	ctrlMQPairsSet    = 0
	ctrlOK            = 0
	ctrlErr           = 1
	ctrlMaxCommandLen = 64
)

// VhostMode selects the data path.
type VhostMode int

// Vhost modes.
const (
	// VhostAuto uses vhost-net when /dev/vhost-net works, else userspace.
	VhostAuto VhostMode = iota
	// VhostOn requires vhost-net (New fails without it).
	VhostOn
	// VhostOff always uses the userspace workers.
	VhostOff
)

// vhostFeatures are the negotiated bits vhost-net is told about: the ring
// and header-layout features. Offloads are between the guest and the TAP.
const vhostFeatures = virtio.FeatureVersion1 | queue.FeatureEventIdx | queue.FeatureIndirectDesc | FeatureMrgRxbuf

// Options configure a Device.
type Options struct {
	// MAC is the guest's address (6 bytes); nil derives one from Name.
	MAC stdnet.HardwareAddr
	// Name identifies the interface (the TAP name) for DeriveMAC and
	// error messages.
	Name string
	// MTU is offered as VIRTIO_NET_F_MTU when non-zero (68-65535).
	MTU int
	// Pairs is the number of queue pairs, one per backend queue fd.
	Pairs int
	// Vhost selects the data path; vhost needs Memory, Regions and a
	// Backend whose fds are TAP queues.
	Vhost VhostMode
	// Memory is guest RAM, to find the rings' host mappings for vhost.
	Memory queue.GuestMemory
	// Regions are guest RAM's regions, for vhost's memory table.
	Regions []uapi.VhostRegion
	// WorkerCPUs are the host CPUs the kernel's vhost-net worker threads
	// may run on: the VM's node's CPUs that no vCPU is pinned to (all of
	// the node's when every one runs a vCPU). Empty leaves the workers
	// where the kernel put them.
	WorkerCPUs []int
	// OnError hears about host-side failures with no caller to return to
	// (TAP I/O errors other than drops, vhost setup). May be nil.
	OnError func(error)
}

// Stats are the device's packet counters since New.
type Stats struct {
	TxPackets, TxBytes, TxDropped uint64
	RxPackets, RxBytes, RxDropped uint64
}

// Device is a virtio-net device. It implements virtio.Device and
// transport.EventFDOwner.
type Device struct {
	backend Backend
	opts    Options
	mac     [6]byte
	pairs   int
	offered uint64
	vhost   bool
	why     string // why vhost is not used, for the log

	linkUp atomic.Bool
	active atomic.Int32 // queue pairs in use (VQ_PAIRS_SET)

	// Set by TakeEventFDs/Activate, cleared by Reset; only the transport's
	// goroutine (and Activate/Reset under the transport's lock) touch them.
	fds      []transport.QueueFDs
	fail     func(error)
	features uint64
	irq      virtio.Interrupter
	ctrl     *queue.Queue
	ctrlCh   *queue.Chain
	ctrlBuf  [ctrlMaxCommandLen]byte
	workers  []*pair
	vhosts   []vhostNet // by pair; nil for a pair not started
	running  bool

	// openVhost opens a vhost-net instance; nil means /dev/vhost-net
	// (tests substitute a recorder).
	openVhost func() (vhostNet, error)
	// procRoot and setAffinity find and place vhost workers ("/proc" and
	// sched_setaffinity unless a test substitutes them).
	procRoot    string
	setAffinity func(tid int, cpus []int) error

	statsMu sync.Mutex
	retired Stats // counters of workers that ended
}

// New builds the device over backend (one queue fd per pair).
func New(backend Backend, opts Options) (*Device, error) {
	if backend == nil {
		return nil, errors.New("virtio-net: new: no backend")
	}
	fds := backend.QueueFDs()
	if opts.Pairs == 0 {
		opts.Pairs = len(fds)
	}
	if opts.Pairs < 1 || opts.Pairs > MaxPairs || opts.Pairs != len(fds) {
		return nil, fmt.Errorf("virtio-net %s: %d queue pairs with %d backend queues: want 1-%d, one backend queue each", opts.Name, opts.Pairs, len(fds), MaxPairs)
	}
	if opts.MTU != 0 && (opts.MTU < 68 || opts.MTU > 65535) {
		return nil, fmt.Errorf("virtio-net %s: MTU %d outside 68-65535", opts.Name, opts.MTU)
	}
	d := &Device{backend: backend, opts: opts, pairs: opts.Pairs}
	mac := opts.MAC
	if mac == nil {
		mac = DeriveMAC(opts.Name)
	}
	if len(mac) != 6 {
		return nil, fmt.Errorf("virtio-net %s: MAC %v is not 6 bytes", opts.Name, mac)
	}
	copy(d.mac[:], mac)
	d.linkUp.Store(true)
	d.active.Store(1)
	d.offered = FeatureCsum | FeatureGuestCsum | FeatureMAC | FeatureStatus | FeatureMrgRxbuf |
		FeatureGuestTSO4 | FeatureGuestTSO6 | FeatureGuestECN |
		FeatureHostTSO4 | FeatureHostTSO6 | FeatureHostECN | FeatureHostUFO
	if opts.MTU != 0 {
		d.offered |= FeatureMTU
	}
	if d.pairs > 1 {
		d.offered |= FeatureCtrlVQ | FeatureMQ
	}
	switch opts.Vhost {
	case VhostOff:
		d.why = "vhost=off"
	case VhostAuto, VhostOn:
		err := probeVhost(opts)
		if err == nil {
			d.vhost = true
			break
		}
		if opts.Vhost == VhostOn {
			return nil, fmt.Errorf("virtio-net %s: vhost=on: %w (use vhost=off for the userspace data path)", opts.Name, err)
		}
		d.why = err.Error()
	default:
		return nil, fmt.Errorf("virtio-net %s: unknown vhost mode %d", opts.Name, opts.Vhost)
	}
	return d, nil
}

// Vhost reports whether the data path runs in the kernel, and if not, why.
func (d *Device) Vhost() (bool, string) { return d.vhost, d.why }

// MAC returns the guest's MAC address.
func (d *Device) MAC() stdnet.HardwareAddr { return append(stdnet.HardwareAddr(nil), d.mac[:]...) }

// SetLinkUp changes the link status the guest sees and tells it.
func (d *Device) SetLinkUp(up bool, irq virtio.Interrupter) {
	if d.linkUp.Swap(up) != up && irq != nil {
		irq.ConfigChanged()
	}
}

// ActivePairs returns the number of queue pairs the driver uses.
func (d *Device) ActivePairs() int { return int(d.active.Load()) }

// Stats sums the packet counters of the userspace data path (vhost keeps
// its own; they stay zero then).
func (d *Device) Stats() Stats {
	d.statsMu.Lock()
	defer d.statsMu.Unlock()
	s := d.retired
	for _, p := range d.workers {
		p.stats.addTo(&s)
	}
	return s
}

// Type implements virtio.Device.
func (d *Device) Type() uint16 { return virtio.DeviceNet }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return d.offered }

// QueueMaxSizes implements virtio.Device.
func (d *Device) QueueMaxSizes() []uint16 {
	n := 2 * d.pairs
	if d.pairs > 1 {
		n++
	}
	s := make([]uint16, n)
	for i := range s {
		s[i] = DataQueueSize
	}
	if d.pairs > 1 {
		s[n-1] = CtrlQueueSize
	}
	return s
}

// ConfigSize implements virtio.Device.
func (d *Device) ConfigSize() int { return configSize }

// ReadConfig implements virtio.Device.
func (d *Device) ReadConfig(offset int, data []byte) {
	var img [configSize]byte
	copy(img[cfgMAC:], d.mac[:])
	if d.linkUp.Load() {
		binary.LittleEndian.PutUint16(img[cfgStatus:], statusLinkUp)
	}
	binary.LittleEndian.PutUint16(img[cfgMaxPairs:], uint16(d.pairs))
	binary.LittleEndian.PutUint16(img[cfgMTU:], uint16(d.opts.MTU))
	clear(data)
	if offset >= 0 && offset < configSize {
		copy(data, img[offset:])
	}
}

// WriteConfig implements virtio.Device: the modern config is read-only
// (the MAC is writable only through VIRTIO_NET_CTRL_MAC, not offered).
func (d *Device) WriteConfig(offset int, data []byte) {}

// TakeEventFDs implements transport.EventFDOwner: the data queues' kicks
// go to the pair workers or to vhost; the control queue stays with the
// transport.
func (d *Device) TakeEventFDs(queues []transport.QueueFDs, fail func(error)) []bool {
	d.fds = append(d.fds[:0], queues...)
	d.fail = fail
	owned := make([]bool, len(queues))
	for i := range owned {
		owned[i] = i < 2*d.pairs
	}
	return owned
}

// Activate implements virtio.Device.
func (d *Device) Activate(features uint64, queues []*queue.Queue, irq virtio.Interrupter) error {
	if len(queues) < 2*d.pairs {
		return fmt.Errorf("virtio-net %s: %d queues, want %d", d.opts.Name, len(queues), 2*d.pairs)
	}
	if len(d.fds) < 2*d.pairs {
		return fmt.Errorf("virtio-net %s: the transport did not hand over the queue eventfds", d.opts.Name)
	}
	d.features, d.irq = features, irq
	if err := d.backend.SetOffload(tunOffloads(features)); err != nil {
		return fmt.Errorf("virtio-net %s: %w", d.opts.Name, err)
	}
	if d.pairs > 1 && features&FeatureCtrlVQ != 0 {
		d.ctrl = queues[2*d.pairs]
		if d.ctrlCh == nil {
			d.ctrlCh = queue.NewChain(queue.MaxSize)
		}
	}
	d.running = true
	if d.vhost {
		// vhost-net refuses a detached TAP queue as a backend (its poll
		// reports EPOLLERR), so attach every queue for the setup and
		// detach the unused ones afterwards, as QEMU does.
		if err := d.setActivePairs(d.pairs); err != nil {
			d.stop()
			return err
		}
		if err := d.startVhost(features, queues); err != nil {
			d.stop()
			return err
		}
	} else {
		d.startWorkers(features, queues)
	}
	// Until VQ_PAIRS_SET only the first pair is in use (virtio 5.1.6.5.5).
	return d.setActivePairs(1)
}

// setActivePairs attaches the backend queues of the first n pairs and
// detaches the rest, then publishes n to the workers.
func (d *Device) setActivePairs(n int) error {
	for i := 0; i < d.pairs; i++ {
		if err := d.backend.EnableQueue(i, i < n); err != nil {
			return fmt.Errorf("virtio-net %s: %w", d.opts.Name, err)
		}
	}
	d.active.Store(int32(n))
	for _, p := range d.workers {
		p.wake()
	}
	return nil
}

// QueueNotify implements virtio.Device; only the control queue is the
// transport's to notify.
func (d *Device) QueueNotify(q int) error {
	if d.ctrl == nil || q != 2*d.pairs {
		return nil
	}
	handled := false
	for {
		ok, err := d.ctrl.Pop(d.ctrlCh)
		if err != nil {
			return fmt.Errorf("virtio-net %s: control queue: %w", d.opts.Name, err)
		}
		if !ok {
			break
		}
		ack, err := d.control(d.ctrlCh)
		if err != nil {
			return err
		}
		if err := d.ctrl.Push(d.ctrlCh.Head, ack); err != nil {
			return err
		}
		handled = true
	}
	if handled && d.ctrl.NeedInterrupt() {
		d.irq.SignalQueue(q)
	}
	return nil
}

// control runs one control command and writes its ack; it returns the
// number of bytes written.
func (d *Device) control(c *queue.Chain) (uint32, error) {
	if c.ReadableLen < 2 || c.WritableLen < 1 {
		return 0, fmt.Errorf("virtio-net %s: control command with %d readable and %d writable bytes, want at least 2 and 1", d.opts.Name, c.ReadableLen, c.WritableLen)
	}
	cmd := d.ctrlBuf[:gather(c, d.ctrlBuf[:])]
	status := byte(ctrlErr)
	if cmd[0] == ctrlClassMQ && cmd[1] == ctrlMQPairsSet && len(cmd) >= 4 && d.features&FeatureMQ != 0 {
		n := int(binary.LittleEndian.Uint16(cmd[2:]))
		if n >= 1 && n <= d.pairs {
			if err := d.setActivePairs(n); err != nil {
				d.report(err)
			} else {
				status = ctrlOK
			}
		}
	}
	for _, s := range c.Segments {
		if s.Writable && len(s.Buf) > 0 {
			s.Buf[0] = status
			break
		}
	}
	return 1, nil
}

// gather copies the chain's readable bytes into dst and returns how many.
func gather(c *queue.Chain, dst []byte) int {
	n := 0
	for _, s := range c.Segments {
		if s.Writable || n == len(dst) {
			break
		}
		n += copy(dst[n:], s.Buf)
	}
	return n
}

// EventFD implements virtio.Device: the workers poll their own fds.
func (d *Device) EventFD() int { return -1 }

// HandleEvent implements virtio.Device.
func (d *Device) HandleEvent() error { return nil }

// Reset implements virtio.Device: stop the workers or vhost instances and
// forget the driver's state.
func (d *Device) Reset() {
	d.stop()
	d.features, d.irq, d.ctrl, d.fail = 0, nil, nil, nil
	d.fds = d.fds[:0]
	d.active.Store(1)
}

func (d *Device) stop() {
	if !d.running {
		return
	}
	for _, p := range d.workers {
		p.stop()
	}
	d.statsMu.Lock()
	for _, p := range d.workers {
		p.stats.addTo(&d.retired)
	}
	d.workers = nil
	d.statsMu.Unlock()
	for _, v := range d.vhosts {
		if v == nil {
			continue
		}
		if err := v.Close(); err != nil {
			d.report(err)
		}
	}
	d.vhosts = nil
	d.running = false
}

func (d *Device) report(err error) {
	if d.opts.OnError != nil {
		d.opts.OnError(err)
	}
}

// Close stops the data path and closes the backend when it is an
// io.Closer (a TAP: an interface hpcvmm created disappears with it). Call
// it after the transport's Close.
func (d *Device) Close() error {
	d.stop()
	if c, ok := d.backend.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
