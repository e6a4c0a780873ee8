// Package queuetest provides a fake guest for virtqueue tests: guest RAM as
// a byte slice at guest-physical address 0 and a minimal split-ring driver
// that writes descriptors and the available ring and reads the used ring, as
// a guest's virtio driver would.
package queuetest

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// Memory is guest RAM starting at guest-physical address 0.
type Memory []byte

// Slice implements queue.GuestMemory with the same bounds rule as guest RAM:
// every byte of [gpa, gpa+n) must exist.
func (m Memory) Slice(gpa, n uint64) ([]byte, error) {
	if gpa > uint64(len(m)) || n > uint64(len(m))-gpa {
		return nil, fmt.Errorf("guest memory: %#x+%#x outside RAM of %#x bytes", gpa, n, len(m))
	}
	return m[gpa : gpa+n : gpa+n], nil
}

// Buf is one buffer of a chain the fake driver adds.
type Buf struct {
	Addr  uint64
	Len   uint32
	Write bool // device-writable
}

// Driver lays out one split virtqueue in Memory and plays the driver.
type Driver struct {
	Mem                     Memory
	Size                    uint16
	DescAddr, Avail, UsedAt uint64
	availIdx                uint16
	lastUsed                uint16
}

// NewDriver places a queue of size entries at base: descriptor table, then
// the available ring, then the used ring (4-byte aligned). The rings start
// zeroed, as a driver leaves them before enabling the queue.
func NewDriver(mem Memory, size uint16, base uint64) *Driver {
	d := &Driver{Mem: mem, Size: size, DescAddr: base}
	d.Avail = base + 16*uint64(size)
	d.UsedAt = (d.Avail + 6 + 2*uint64(size) + 3) &^ 3
	clear(mem[base : d.UsedAt+6+8*uint64(size)])
	return d
}

// Config returns the layout to program into the device.
func (d *Driver) Config() queue.Config {
	return queue.Config{Size: d.Size, Desc: d.DescAddr, Driver: d.Avail, Device: d.UsedAt}
}

// End returns the first address after the used ring.
func (d *Driver) End() uint64 { return d.UsedAt + 6 + 8*uint64(d.Size) }

// SetDesc writes descriptor i of the table at tableAddr (DescAddr for the
// queue's own table, or an indirect table's address).
func (d *Driver) SetDesc(tableAddr uint64, i uint16, addr uint64, length uint32, flags, next uint16) {
	b := d.Mem[tableAddr+16*uint64(i):]
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// Chain writes bufs as a chain at descriptors head, head+1, ... of the
// table at tableAddr (wrapping at Size for the queue's own table).
func (d *Driver) Chain(tableAddr uint64, head uint16, bufs []Buf) {
	for k, b := range bufs {
		i := head + uint16(k)
		next := i + 1
		if tableAddr == d.DescAddr {
			i %= d.Size
			next %= d.Size
		}
		var flags uint16
		if b.Write {
			flags |= queue.DescFlagWrite
		}
		if k < len(bufs)-1 {
			flags |= queue.DescFlagNext
		} else {
			next = 0
		}
		d.SetDesc(tableAddr, i, b.Addr, b.Len, flags, next)
	}
}

// Publish makes head available and advances the available index.
func (d *Driver) Publish(head uint16) {
	binary.LittleEndian.PutUint16(d.Mem[d.Avail+4+2*uint64(d.availIdx%d.Size):], head)
	d.availIdx++
	binary.LittleEndian.PutUint16(d.Mem[d.Avail+2:], d.availIdx)
}

// SetAvailIdx overwrites the available index (to model a hostile driver).
func (d *Driver) SetAvailIdx(v uint16) {
	d.availIdx = v
	binary.LittleEndian.PutUint16(d.Mem[d.Avail+2:], v)
}

// SetAvailFlags writes the available ring's flags.
func (d *Driver) SetAvailFlags(f uint16) { binary.LittleEndian.PutUint16(d.Mem[d.Avail:], f) }

// SetUsedEvent writes used_event (EVENT_IDX).
func (d *Driver) SetUsedEvent(v uint16) {
	binary.LittleEndian.PutUint16(d.Mem[d.Avail+4+2*uint64(d.Size):], v)
}

// AvailEvent reads avail_event, written by the device (EVENT_IDX).
func (d *Driver) AvailEvent() uint16 {
	return binary.LittleEndian.Uint16(d.Mem[d.UsedAt+4+8*uint64(d.Size):])
}

// UsedFlags reads the used ring's flags.
func (d *Driver) UsedFlags() uint16 { return binary.LittleEndian.Uint16(d.Mem[d.UsedAt:]) }

// UsedIdx reads the device's used index.
func (d *Driver) UsedIdx() uint16 { return binary.LittleEndian.Uint16(d.Mem[d.UsedAt+2:]) }

// NextUsed consumes the next used entry, if the device published one.
func (d *Driver) NextUsed() (id, length uint32, ok bool) {
	if d.UsedIdx() == d.lastUsed {
		return 0, 0, false
	}
	e := d.Mem[d.UsedAt+4+8*uint64(d.lastUsed%d.Size):]
	d.lastUsed++
	return binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:]), true
}
