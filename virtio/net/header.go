package net

import (
	"encoding/binary"
	"errors"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// Device feature bits (virtio 1.x 5.1.3).
const (
	FeatureCsum      = uint64(1) << 0  // device takes packets with partial checksum
	FeatureGuestCsum = uint64(1) << 1  // driver takes packets with partial checksum
	FeatureMTU       = uint64(1) << 3  // config mtu is valid
	FeatureMAC       = uint64(1) << 5  // config mac is valid
	FeatureGuestTSO4 = uint64(1) << 7  // driver takes TSOv4
	FeatureGuestTSO6 = uint64(1) << 8  // driver takes TSOv6
	FeatureGuestECN  = uint64(1) << 9  // driver takes TSO with ECN
	FeatureGuestUFO  = uint64(1) << 10 // driver takes UFO
	FeatureHostTSO4  = uint64(1) << 11 // device takes TSOv4
	FeatureHostTSO6  = uint64(1) << 12 // device takes TSOv6
	FeatureHostECN   = uint64(1) << 13 // device takes TSO with ECN
	FeatureHostUFO   = uint64(1) << 14 // device takes UFO
	FeatureMrgRxbuf  = uint64(1) << 15 // driver can merge receive buffers
	FeatureStatus    = uint64(1) << 16 // config status is valid
	FeatureCtrlVQ    = uint64(1) << 17 // control virtqueue
	FeatureMQ        = uint64(1) << 22 // multiqueue with automatic steering
)

// HeaderSize is sizeof(struct virtio_net_hdr_v1): with VIRTIO_F_VERSION_1
// every packet carries num_buffers, mergeable buffers or not.
const HeaderSize = 12

// virtio_net_hdr flags and gso_type values.
const (
	HdrNeedsCsum = 1
	HdrDataValid = 2

	GSONone  = 0
	GSOTCPv4 = 1
	GSOUDP   = 3
	GSOTCPv6 = 4
	GSOECN   = 0x80
)

// Frame bounds: an Ethernet header at least; at most a 64 KiB GSO payload
// with Ethernet and VLAN headers (the TAP refuses more anyway).
const (
	minFrame = 14
	maxFrame = 65535 + 14 + 4
)

// Header is struct virtio_net_hdr_v1.
type Header struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16
}

// ParseHeader decodes the first HeaderSize bytes of b; ok is false when b
// is shorter.
func ParseHeader(b []byte) (h Header, ok bool) {
	if len(b) < HeaderSize {
		return h, false
	}
	le := binary.LittleEndian
	return Header{
		Flags: b[0], GSOType: b[1], HdrLen: le.Uint16(b[2:]), GSOSize: le.Uint16(b[4:]),
		CsumStart: le.Uint16(b[6:]), CsumOffset: le.Uint16(b[8:]), NumBuffers: le.Uint16(b[10:]),
	}, true
}

// Put encodes h into the first HeaderSize bytes of b (which must have room).
func (h Header) Put(b []byte) {
	le := binary.LittleEndian
	b[0], b[1] = h.Flags, h.GSOType
	le.PutUint16(b[2:], h.HdrLen)
	le.PutUint16(b[4:], h.GSOSize)
	le.PutUint16(b[6:], h.CsumStart)
	le.PutUint16(b[8:], h.CsumOffset)
	le.PutUint16(b[10:], h.NumBuffers)
}

// Reasons a transmitted packet is dropped. Sentinels, so a guest sending
// bad packets in a loop cannot make the device allocate.
var (
	ErrShortFrame    = errors.New("virtio-net: transmit frame shorter than an Ethernet header")
	ErrLongFrame     = errors.New("virtio-net: transmit frame longer than 64 KiB plus headers")
	ErrHeaderFlags   = errors.New("virtio-net: transmit header has unknown flags")
	ErrCsumFeature   = errors.New("virtio-net: partial checksum without VIRTIO_NET_F_CSUM")
	ErrCsumRange     = errors.New("virtio-net: checksum start/offset outside the frame")
	ErrGSOFeature    = errors.New("virtio-net: GSO type not negotiated")
	ErrGSOSize       = errors.New("virtio-net: GSO packet with gso_size 0")
	ErrGSOHeaderLen  = errors.New("virtio-net: GSO hdr_len beyond the frame")
	errNoRxBuffer    = errors.New("virtio-net: receive chain has no device-writable buffer")
	errRxHeaderSplit = errors.New("virtio-net: first receive buffer smaller than the virtio-net header")
)

// ValidateTx checks a transmit header from the guest against the frame
// length (bytes after the header) and the negotiated features, so only
// what the device offered reaches the TAP. The kernel checks the header
// again; this keeps a misbehaving guest from using offloads hpcvmm did not
// offer. It normalizes nothing and never panics.
func ValidateTx(h Header, frameLen int, features uint64) error {
	if frameLen < minFrame {
		return ErrShortFrame
	}
	if frameLen > maxFrame {
		return ErrLongFrame
	}
	if h.Flags&^(HdrNeedsCsum|HdrDataValid) != 0 {
		return ErrHeaderFlags
	}
	if h.Flags&HdrNeedsCsum != 0 {
		if features&FeatureCsum == 0 {
			return ErrCsumFeature
		}
		if int(h.CsumStart)+int(h.CsumOffset)+2 > frameLen {
			return ErrCsumRange
		}
	}
	gso := h.GSOType &^ GSOECN
	if gso == GSONone {
		if h.GSOType&GSOECN != 0 {
			return ErrGSOFeature
		}
		return nil
	}
	var need uint64
	switch gso {
	case GSOTCPv4:
		need = FeatureHostTSO4
	case GSOTCPv6:
		need = FeatureHostTSO6
	case GSOUDP:
		need = FeatureHostUFO
	default:
		return ErrGSOFeature
	}
	if h.GSOType&GSOECN != 0 {
		need |= FeatureHostECN
	}
	if features&need != need {
		return ErrGSOFeature
	}
	if h.GSOSize == 0 {
		return ErrGSOSize
	}
	if int(h.HdrLen) > frameLen {
		return ErrGSOHeaderLen
	}
	return nil
}

// tunOffloads maps the driver's receive features to TUNSETOFFLOAD flags:
// the kernel may then hand the guest packets with partial checksums and
// GSO of the kinds the guest accepts, and no others.
func tunOffloads(features uint64) uint32 {
	if features&FeatureGuestCsum == 0 {
		return 0 // GSO packets always carry a partial checksum
	}
	f := uint32(uapi.TunFCsum)
	if features&FeatureGuestTSO4 != 0 {
		f |= uapi.TunFTSO4
	}
	if features&FeatureGuestTSO6 != 0 {
		f |= uapi.TunFTSO6
	}
	if features&FeatureGuestECN != 0 && f&(uapi.TunFTSO4|uapi.TunFTSO6) != 0 {
		f |= uapi.TunFTSOECN
	}
	if features&FeatureGuestUFO != 0 {
		f |= uapi.TunFUFO
	}
	return f
}
