// Message bodies: each message type's encoding after the frame header, and
// the strict decoder that reads them (a count is bounded by the bytes left).

package jobproto

import (
	"encoding/binary"
	"fmt"
	"net"
	"time"
)

func (m *Start) appendBody(b []byte) []byte {
	b = appendStrings(b, m.Argv)
	b = appendStrings(b, m.Env)
	b = appendString(b, m.Workdir)
	b = appendBool(b, m.SetUser)
	b = binary.AppendUvarint(b, uint64(m.UID))
	b = binary.AppendUvarint(b, uint64(m.GID))
	b = appendBool(b, m.TTY)
	b = binary.AppendUvarint(b, uint64(m.Rows))
	b = binary.AppendUvarint(b, uint64(m.Cols))
	b = appendString(b, m.Hostname)
	b = binary.AppendUvarint(b, uint64(len(m.Interfaces)))
	for _, i := range m.Interfaces {
		b = appendBytes(b, i.MAC)
		if i.Address != nil {
			b = appendBytes(b, i.Address.IP)
			b = appendBytes(b, i.Address.Mask)
		} else {
			b = appendBytes(b, nil)
			b = appendBytes(b, nil)
		}
		b = appendBytes(b, i.Gateway)
		b = appendBool(b, i.DHCP)
	}
	b = binary.AppendUvarint(b, uint64(len(m.DNS)))
	for _, ip := range m.DNS {
		b = appendBytes(b, ip)
	}
	b = binary.AppendUvarint(b, uint64(len(m.HugePageSizes)))
	for _, s := range m.HugePageSizes {
		b = binary.AppendUvarint(b, s)
	}
	b = binary.AppendUvarint(b, uint64(m.StopGrace/time.Millisecond))
	b = appendBool(b, m.PMI)
	b = binary.AppendUvarint(b, uint64(len(m.Groups)))
	for _, g := range m.Groups {
		b = binary.AppendUvarint(b, uint64(g))
	}
	b = appendString(b, m.UserName)
	b = appendString(b, m.GroupName)
	b = appendString(b, m.Home)
	b = binary.AppendUvarint(b, uint64(len(m.Mounts)))
	for _, mt := range m.Mounts {
		b = appendString(b, mt.Port)
		b = appendString(b, mt.Target)
		b = appendBool(b, mt.ReadOnly)
		b = binary.AppendUvarint(b, uint64(mt.MSize))
		b = appendString(b, mt.Cache)
	}
	if m.GPUs != 0 { // see Start.GPUs: absent means none
		b = binary.AppendUvarint(b, uint64(m.GPUs))
	}
	return b
}

func (m *Start) decodeBody(d *decoder) {
	m.Argv = d.strings("argv")
	m.Env = d.strings("env")
	m.Workdir = d.string("workdir")
	m.SetUser = d.bool("setuser")
	m.UID = uint32(d.uint("uid", 1<<32-1))
	m.GID = uint32(d.uint("gid", 1<<32-1))
	m.TTY = d.bool("tty")
	m.Rows = uint16(d.uint("rows", 1<<16-1))
	m.Cols = uint16(d.uint("cols", 1<<16-1))
	m.Hostname = d.string("hostname")
	n := d.count("interfaces", 5) // at least 5 bytes each
	if n > 0 {
		m.Interfaces = make([]Interface, n)
	}
	for i := range m.Interfaces {
		it := &m.Interfaces[i]
		it.MAC = net.HardwareAddr(d.bytes("mac"))
		ip, mask := d.bytes("address"), d.bytes("mask")
		if d.err == nil && (ip != nil || mask != nil) {
			if !ipLen(len(ip)) || len(mask) != len(ip) {
				d.fail("interface %d: address of %d bytes with a mask of %d", i, len(ip), len(mask))
			}
			it.Address = &net.IPNet{IP: net.IP(ip), Mask: net.IPMask(mask)}
		}
		it.Gateway = d.ip("gateway")
		it.DHCP = d.bool("dhcp")
	}
	n = d.count("dns", 1)
	if n > 0 {
		m.DNS = make([]net.IP, n)
	}
	for i := range m.DNS {
		m.DNS[i] = d.ip("dns")
		if d.err == nil && m.DNS[i] == nil {
			d.fail("empty name server address")
		}
	}
	n = d.count("hugepages", 1)
	if n > 0 {
		m.HugePageSizes = make([]uint64, n)
	}
	for i := range m.HugePageSizes {
		m.HugePageSizes[i] = d.uint("hugepage size", 1<<63)
	}
	m.StopGrace = time.Duration(d.uint("stop grace", uint64(MaxStopGrace/time.Millisecond))) * time.Millisecond
	m.PMI = d.bool("pmi")
	n = d.count("groups", 1)
	if n > MaxGroups {
		d.fail("%d groups, at most %d", n, MaxGroups)
	}
	if n > 0 && d.err == nil {
		m.Groups = make([]uint32, n)
	}
	for i := range m.Groups {
		m.Groups[i] = uint32(d.uint("group", 1<<32-1))
	}
	m.UserName = d.string("user name")
	m.GroupName = d.string("group name")
	m.Home = d.string("home")
	n = d.count("mounts", 5) // at least 5 bytes each
	if n > MaxMounts {
		d.fail("%d mounts, at most %d", n, MaxMounts)
	}
	if n > 0 && d.err == nil {
		m.Mounts = make([]Mount, n)
	}
	for i := range m.Mounts {
		mt := &m.Mounts[i]
		mt.Port = d.string("mount port")
		mt.Target = d.string("mount target")
		mt.ReadOnly = d.bool("mount read-only")
		mt.MSize = uint32(d.uint("mount msize", 1<<32-1))
		mt.Cache = d.string("mount cache")
	}
	if d.err == nil && len(d.b) > 0 {
		m.GPUs = uint32(d.uint("gpus", MaxGPUs))
		if d.err == nil && m.GPUs == 0 {
			d.fail("gpus: 0 spelled out (none is encoded as nothing)")
		}
	}
}

func ipLen(n int) bool { return n == net.IPv4len || n == net.IPv6len }

func (m *Signal) appendBody(b []byte) []byte { return append(b, m.Signo) }
func (m *Signal) decodeBody(d *decoder) {
	m.Signo = uint8(d.uint("signal", 64))
	if d.err == nil && m.Signo == 0 {
		d.fail("signal 0")
	}
}

func (m *Resize) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(m.Rows))
	return binary.AppendUvarint(b, uint64(m.Cols))
}
func (m *Resize) decodeBody(d *decoder) {
	m.Rows = uint16(d.uint("rows", 1<<16-1))
	m.Cols = uint16(d.uint("cols", 1<<16-1))
}

func (*Ready) appendBody(b []byte) []byte { return b }
func (*Ready) decodeBody(*decoder)        {}

func (m *Started) appendBody(b []byte) []byte { return binary.AppendUvarint(b, uint64(m.PID)) }
func (m *Started) decodeBody(d *decoder)      { m.PID = uint32(d.uint("pid", 1<<32-1)) }

func (m *Exited) appendBody(b []byte) []byte { return append(b, m.Code, m.Signal) }
func (m *Exited) decodeBody(d *decoder) {
	m.Code = d.byte("code")
	m.Signal = d.byte("signal")
	if d.err == nil && m.Signal > 64 {
		d.fail("signal %d", m.Signal)
	}
	if d.err == nil && m.Signal != 0 && m.Code != 0 {
		d.fail("both code %d and signal %d", m.Code, m.Signal)
	}
}

func (m *Failed) appendBody(b []byte) []byte {
	b = append(b, byte(m.Kind))
	return appendString(b, m.Reason)
}
func (m *Failed) decodeBody(d *decoder) {
	m.Kind = FailKind(d.byte("kind"))
	if d.err == nil && (m.Kind < FailAgent || m.Kind > FailNotExecutable) {
		d.fail("unknown failure kind %d", m.Kind)
	}
	m.Reason = d.string("reason")
}

func (m *Log) appendBody(b []byte) []byte { return appendString(b, m.Text) }
func (m *Log) decodeBody(d *decoder)      { m.Text = d.string("text") }

// Encoding helpers.

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

// decoder reads a body strictly: the first error sticks and every later
// read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("%s: body ends early", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bool(what string) bool {
	v := d.byte(what)
	if v > 1 {
		d.fail("%s: %d is not a boolean", what, v)
	}
	return v == 1
}

// uint reads a uvarint no larger than max, in its shortest encoding (so
// every value has one encoding and decode∘encode is the identity on bytes).
func (d *decoder) uint(what string, max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s: bad varint", what)
		return 0
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		d.fail("%s: varint not in its shortest form", what)
		return 0
	}
	if v > max {
		d.fail("%s: %d out of range (max %d)", what, v, max)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes reads a length-prefixed byte string; nil when empty.
func (d *decoder) bytes(what string) []byte {
	n := d.uint(what, uint64(len(d.b)))
	if d.err != nil || n == 0 {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("%s: %d bytes announced, %d left", what, n, len(d.b))
		return nil
	}
	v := make([]byte, n)
	copy(v, d.b)
	d.b = d.b[n:]
	return v
}

func (d *decoder) string(what string) string { return string(d.bytes(what)) }

// count reads a list length, checked against what is left at minEach bytes
// an element, so a frame cannot make the decoder allocate beyond its size.
func (d *decoder) count(what string, minEach int) int {
	return int(d.uint(what, uint64(len(d.b)/minEach)))
}

func (d *decoder) strings(what string) []string {
	n := d.count(what, 1)
	if n == 0 {
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.string(what)
	}
	return ss
}

// ip reads an address of 0 (nil), 4 or 16 bytes.
func (d *decoder) ip(what string) net.IP {
	b := d.bytes(what)
	if b != nil && !ipLen(len(b)) {
		d.fail("%s: address of %d bytes", what, len(b))
		return nil
	}
	return net.IP(b)
}
