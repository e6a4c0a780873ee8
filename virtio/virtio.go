// Package virtio holds what virtio devices and transports share (virtio
// 1.x): device status bits, transport feature bits, device types, and the
// Device interface a transport drives. Queues are in virtio/queue, the PCI
// transport in virtio/transport, devices in their own packages.
package virtio

import "github.com/hpcvmm/hpcvmm/virtio/queue"

// Device status bits (virtio 1.x 2.1).
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 0x40
	StatusFailed      = 0x80
)

// Transport-level feature bits.
const (
	// FeatureVersion1 is VIRTIO_F_VERSION_1: modern devices only.
	FeatureVersion1 = uint64(1) << 32
	// FeatureIndirectDesc and FeatureEventIdx are the ring features.
	FeatureIndirectDesc = queue.FeatureIndirectDesc
	FeatureEventIdx     = queue.FeatureEventIdx
)

// Device types (virtio 1.x 5).
const (
	DeviceNet     = 1
	DeviceBlock   = 2
	DeviceConsole = 3
)

// NoVector is VIRTIO_MSI_NO_VECTOR.
const NoVector = 0xffff

// Interrupter raises a device's interrupts. Safe from the device goroutine
// and from host goroutines; allocation-free.
type Interrupter interface {
	// SignalQueue raises queue q's used-buffer interrupt. Devices call it
	// when queue.NeedInterrupt says the driver wants one.
	SignalQueue(q int)
	// ConfigChanged bumps the config generation and raises the
	// configuration-change interrupt.
	ConfigChanged()
}

// Device is a virtio device model behind a transport. The transport owns
// feature negotiation, queue setup, the status machine and the device's
// goroutine; it calls Activate, QueueNotify, HandleEvent and Reset on that
// goroutine's behalf and never concurrently with each other.
// ReadConfig/WriteConfig run on vCPU threads and must lock what they share.
type Device interface {
	// Type is the virtio device ID (DeviceConsole, ...).
	Type() uint16
	// Features are the device-specific feature bits offered (bits 0-23).
	Features() uint64
	// QueueMaxSizes lists the maximum size of each queue (powers of two,
	// at most queue.MaxSize); its length is the number of queues.
	QueueMaxSizes() []uint16
	// ConfigSize is the size of the device-specific configuration.
	ConfigSize() int
	// ReadConfig fills data from device configuration offset.
	ReadConfig(offset int, data []byte)
	// WriteConfig applies a driver write to the device configuration.
	WriteConfig(offset int, data []byte)
	// Activate starts the device after DRIVER_OK with the negotiated
	// features and the queues (nil where the driver left a queue disabled).
	Activate(features uint64, queues []*queue.Queue, irq Interrupter) error
	// QueueNotify processes queue q after a driver notification (or once
	// right after Activate). An error means the driver broke the protocol;
	// the transport sets DEVICE_NEEDS_RESET and stops calling the device.
	QueueNotify(q int) error
	// EventFD is a file descriptor the device goroutine polls for host-side
	// work (e.g. console input), or -1.
	EventFD() int
	// HandleEvent runs when EventFD is readable; the device drains it.
	HandleEvent() error
	// Reset returns the device to its pre-Activate state; it must not touch
	// the queues afterwards.
	Reset()
}
