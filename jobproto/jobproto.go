// Package jobproto is the wire protocol between hpcvmm (package job, on the
// host) and its guest agent (package agent, PID 1 in the guest) for
// `hpcvmm run --rootfs IMAGE -- COMMAND` (docs/jobs.md).
//
// Four named virtio-console ports connect them (the Port* constants): the
// control port carries the frames of this package both ways, the three
// stream ports carry COMMAND's stdin, stdout and stderr as raw bytes.
//
// A frame is a 4-byte big-endian length n, then n bytes: the protocol
// version (Version), the message type, and the message body. Integers in a
// body are unsigned varints (encoding/binary's uvarint), strings and byte
// strings a uvarint length and the bytes, lists a uvarint count and the
// elements. A frame is read only after its length has been checked against
// the reader's bound (Reader), so a peer cannot make the other side allocate
// more than that bound; the body is decoded strictly: a short or overlong
// body, trailing bytes, an unknown type or version, or a value out of range
// is an error, never a message. The host reads what the guest sends with a
// small bound (MaxGuestFrame): everything the guest sends is untrusted.
//
// The encoding is hand-written rather than JSON or protobuf: argv and the
// environment are byte strings on Linux, not necessarily UTF-8, and must
// arrive unchanged (encoding/json replaces invalid UTF-8), and the protocol
// is small enough that a code generator would add more than it saves.
//
// The package also owns the job's exit status (Status, ExitCode): COMMAND's
// exit code, 128+N for signal N, and 127/126/125 when COMMAND was not found,
// not executable, or the VM or the agent failed, as `docker run` uses them.
package jobproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Names of the virtio-console ports of a job (VIRTIO_CONSOLE_PORT_NAME; the
// guest finds them in /sys/class/virtio-ports/*/name).
const (
	// PortControl carries this package's frames, both ways.
	PortControl = "org.hpcvmm.control"
	// PortStdin carries hpcvmm's stdin to COMMAND; end of file is passed on.
	PortStdin = "org.hpcvmm.stdin"
	// PortStdout carries COMMAND's stdout (with a pty: the terminal's output).
	PortStdout = "org.hpcvmm.stdout"
	// PortStderr carries COMMAND's stderr (unused with a pty).
	PortStderr = "org.hpcvmm.stderr"
)

// Version is the protocol version every frame carries. A peer refuses a
// frame of another version: host and agent are the same binary, so a
// mismatch means a stale initramfs or a foreign agent.
const Version = 1

// Frame bounds. A frame's length counts the version, type and body bytes.
const (
	// MaxFrame bounds every frame: a Start carries argv and the
	// environment, which Linux bounds by ARG_MAX (a quarter of the stack
	// limit, 2 MiB by default), so 4 MiB holds any command line Linux can
	// exec.
	MaxFrame = 4 << 20
	// MaxGuestFrame bounds the frames the host reads from the guest: none
	// of Ready, Started, Exited, Failed or Log needs more, and the guest is
	// untrusted.
	MaxGuestFrame = 64 << 10
	// headerLen is the length prefix.
	headerLen = 4
)

// Type identifies a message on the wire.
type Type uint8

// Message types. Host to guest: Start, Signal, Resize. Guest to host:
// Ready, Started, Exited, Failed, Log.
const (
	TypeStart   Type = 1
	TypeSignal  Type = 2
	TypeResize  Type = 3
	TypeReady   Type = 16
	TypeStarted Type = 17
	TypeExited  Type = 18
	TypeFailed  Type = 19
	TypeLog     Type = 20
)

// Message is one of *Start, *Signal, *Resize, *Ready, *Started, *Exited,
// *Failed, *Log.
type Message interface {
	// Type is the message's wire type.
	Type() Type
	appendBody(b []byte) []byte
	decodeBody(d *decoder)
}

// Start tells the agent what to run. The agent sends Started or Failed in
// answer, then Exited when COMMAND ends.
type Start struct {
	// Argv is COMMAND and its arguments; Argv[0] is looked up in the
	// guest's PATH (from Env) when it has no slash.
	Argv []string
	// Env is COMMAND's environment, KEY=VALUE each.
	Env []string
	// Workdir is COMMAND's working directory; empty means /.
	Workdir string
	// SetUser says whether UID and GID apply; otherwise COMMAND runs as
	// root (the guest's, in a VM of its own).
	SetUser bool
	// UID and GID are COMMAND's user and group when SetUser is true.
	UID, GID uint32
	// Groups are COMMAND's supplementary groups when SetUser is true
	// (none: dropped), at most MaxGroups.
	Groups []uint32
	// UserName and Home name COMMAND's user for the guest's /etc/passwd
	// (and the group's name GroupName for /etc/group) when IMAGE has no
	// entry for UID (GID): so `id`, `whoami` and ls show the host's
	// names. Empty: no entry is added.
	UserName, GroupName, Home string
	// TTY gives COMMAND a pty of Rows x Cols (0: unknown) instead of raw
	// byte streams: stdout and stderr both go to PortStdout.
	TTY        bool
	Rows, Cols uint16
	// Hostname is the guest's hostname; empty keeps the kernel's.
	Hostname string
	// Interfaces are the guest's network interfaces to configure, in the
	// order of the VM's virtio-net devices.
	Interfaces []Interface
	// DNS are the name servers for /etc/resolv.conf; none leaves the
	// file as IMAGE has it.
	DNS []net.IP
	// HugePageSizes are the page sizes (bytes) for which the agent mounts
	// a hugetlbfs (at /dev/hugepages for the first, /dev/hugepages-SIZE
	// for each).
	HugePageSizes []uint64
	// StopGrace is how long COMMAND has between the agent's SIGTERM and
	// SIGKILL after the power button (whole milliseconds, at most
	// MaxStopGrace); 0 means the agent's default. The host makes it
	// shorter than its own wait after pressing the button.
	StopGrace time.Duration
	// PMI says the host relays a Slurm PMI socket on the ports pmi.PortIn
	// and pmi.PortOut: the agent gives COMMAND a socket of its own in
	// PMI_FD, relayed to them (package pmi).
	PMI bool
	// Mounts are host directories the agent mounts (9P2000.L on a named
	// port of their own) before COMMAND starts, in order; at most
	// MaxMounts.
	Mounts []Mount
	// GPUs is how many NVIDIA GPUs the VM has passed through (at most
	// MaxGPUs; 0: none): once the modules are loaded and before COMMAND
	// starts, the agent creates their device nodes (/dev/nvidiaN,
	// nvidiactl, nvidia-uvm, nvidia-caps) as the driver's tools do on a
	// host, with the majors of the guest's own /proc/devices. It is
	// encoded last and only when not 0, so a Start without GPUs has the
	// bytes it had before the field existed: Version stays 1, and a
	// frame that spells out 0 is not canonical and refused.
	GPUs uint32
}

// MaxGPUs bounds Start.GPUs: the nvidia major's minors 0-254 are GPUs,
// 255 is nvidiactl.
const MaxGPUs = 255

// Mount is one host directory in the guest: the agent relays the port
// Port to a socket pair and mounts the kernel's 9P client on it at Target.
type Mount struct {
	// Port is the virtio-console port carrying the 9P connection.
	Port string
	// Target is the absolute, clean path of the mount in the guest.
	Target string
	// ReadOnly mounts it read-only (the host's server refuses writes too).
	ReadOnly bool
	// MSize is the 9P message size the agent asks the kernel for.
	MSize uint32
	// Cache is the kernel 9P client's cache= mode ("" for its default).
	Cache string
}

// ReservedTargets are the guest paths the agent needs for itself: a mount
// on one of them, or beneath one, would hide what the job's VM runs on.
// The host refuses such a bind (package binds) and the agent such a Mount.
var ReservedTargets = []string{"/", "/proc", "/sys", "/dev", "/.hpcvmm"}

// The host NVIDIA driver's user space in the guest (issue 32): two flat
// read-only 9P directories of host files (the libraries with their soname
// links, the programs), mounted by the agent as Mounts at these targets,
// the only Mount targets beneath a reserved path it takes. COMMAND's
// LD_LIBRARY_PATH and PATH get them appended, as Apptainer's --nv appends
// /.singularity.d/libs.
const (
	DriverLibDir = "/.hpcvmm/driver/lib"
	DriverBinDir = "/.hpcvmm/driver/bin"
)

// ReservedBy returns the reserved path that target is or lies beneath, ""
// when it is free.
func ReservedBy(target string) string {
	for _, r := range ReservedTargets {
		if target == r || (r != "/" && strings.HasPrefix(target, r+"/")) {
			return r
		}
	}
	return ""
}

// Bounds of Start's lists that the agent acts on one by one.
const (
	// MaxMounts bounds Start.Mounts: each takes a port, and a Console has
	// at most 16 named ports.
	MaxMounts = 16
	// MaxGroups bounds Start.Groups (Linux's NGROUPS_MAX is 65536; a
	// user's groups on a cluster are far fewer).
	MaxGroups = 1024
)

// MaxStopGrace bounds Start.StopGrace.
const MaxStopGrace = 24 * time.Hour

// Interface is one guest network interface, found by its MAC address.
type Interface struct {
	// MAC identifies the interface (the VM's virtio-net MAC).
	MAC net.HardwareAddr
	// Address is the static address and prefix; nil with DHCP.
	Address *net.IPNet
	// Gateway is the default route's next hop; nil for none.
	Gateway net.IP
	// DHCP asks the agent to run a DHCP client on the interface.
	DHCP bool
}

// Signal asks the agent to send Signo to COMMAND's process group.
type Signal struct{ Signo uint8 }

// Resize tells the agent the host terminal's new size (TTY jobs).
type Resize struct{ Rows, Cols uint16 }

// Ready is the agent's first message: the guest is up and reads Start.
type Ready struct{}

// Started says COMMAND runs, with its PID in the guest.
type Started struct{ PID uint32 }

// Exited is COMMAND's end: Code when it exited, Signal (non-zero) when a
// signal killed it.
type Exited struct {
	Code   uint8
	Signal uint8
}

// Failed says COMMAND could not be run (or the agent failed): Kind decides
// the exit status, Reason is the one line hpcvmm prints.
type Failed struct {
	Kind   FailKind
	Reason string
}

// Log is a line of the agent's own (a warning), for hpcvmm's log.
type Log struct{ Text string }

// Type implements Message.
func (*Start) Type() Type { return TypeStart }

// Type implements Message.
func (*Signal) Type() Type { return TypeSignal }

// Type implements Message.
func (*Resize) Type() Type { return TypeResize }

// Type implements Message.
func (*Ready) Type() Type { return TypeReady }

// Type implements Message.
func (*Started) Type() Type { return TypeStarted }

// Type implements Message.
func (*Exited) Type() Type { return TypeExited }

// Type implements Message.
func (*Failed) Type() Type { return TypeFailed }

// Type implements Message.
func (*Log) Type() Type { return TypeLog }

// newMessage returns an empty message of type t, or nil for an unknown t.
func newMessage(t Type) Message {
	switch t {
	case TypeStart:
		return &Start{}
	case TypeSignal:
		return &Signal{}
	case TypeResize:
		return &Resize{}
	case TypeReady:
		return &Ready{}
	case TypeStarted:
		return &Started{}
	case TypeExited:
		return &Exited{}
	case TypeFailed:
		return &Failed{}
	case TypeLog:
		return &Log{}
	}
	return nil
}

// Errors of the framing.
var (
	// ErrFrameTooLarge is a frame longer than the bound (MaxFrame, or the
	// Reader's).
	ErrFrameTooLarge = errors.New("jobproto: frame longer than the bound")
	// ErrMalformed is a frame whose body does not decode.
	ErrMalformed = errors.New("jobproto: malformed frame")
)

// AppendFrame appends m's frame to b.
func AppendFrame(b []byte, m Message) ([]byte, error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0, Version, byte(m.Type()))
	b = m.appendBody(b)
	n := len(b) - start - headerLen
	if n > MaxFrame {
		return b[:start], fmt.Errorf("%w: %s of %d bytes (bound %d)", ErrFrameTooLarge, typeName(m.Type()), n, MaxFrame)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(n))
	return b, nil
}

// Write writes m's frame to w in one Write.
func Write(w io.Writer, m Message) error {
	b, err := AppendFrame(nil, m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Reader reads frames from a stream, none longer than its bound.
type Reader struct {
	r   io.Reader
	max int
	buf []byte
}

// NewReader reads frames of at most bound bytes (after the length prefix)
// from r; bound is clamped to [2, MaxFrame].
func NewReader(r io.Reader, bound int) *Reader {
	return &Reader{r: r, max: min(MaxFrame, max(bound, 2))}
}

// Read returns the next message. At a clean end of the stream between
// frames it returns io.EOF; a stream that ends inside a frame gives
// io.ErrUnexpectedEOF; a frame over the bound ErrFrameTooLarge (without
// reading it); a frame that does not decode ErrMalformed. After an error
// the stream's position is undefined: the caller gives up on it.
func (r *Reader) Read() (Message, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > uint32(r.max) {
		return nil, fmt.Errorf("%w: %d bytes (bound %d)", ErrFrameTooLarge, n, r.max)
	}
	if n < 2 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than version and type", ErrMalformed, n)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	if _, err := io.ReadFull(r.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return Decode(buf)
}

// Decode decodes one frame's content (version, type, body: the bytes after
// the length prefix).
func Decode(frame []byte) (Message, error) {
	if len(frame) < 2 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than version and type", ErrMalformed, len(frame))
	}
	if frame[0] != Version {
		return nil, fmt.Errorf("%w: protocol version %d, this hpcvmm speaks %d (an initramfs from another hpcvmm?)", ErrMalformed, frame[0], Version)
	}
	m := newMessage(Type(frame[1]))
	if m == nil {
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, frame[1])
	}
	d := decoder{b: frame[2:]}
	m.decodeBody(&d)
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, typeName(m.Type()), d.err)
	}
	return m, nil
}

func typeName(t Type) string {
	switch t {
	case TypeStart:
		return "Start"
	case TypeSignal:
		return "Signal"
	case TypeResize:
		return "Resize"
	case TypeReady:
		return "Ready"
	case TypeStarted:
		return "Started"
	case TypeExited:
		return "Exited"
	case TypeFailed:
		return "Failed"
	case TypeLog:
		return "Log"
	}
	return fmt.Sprintf("type %d", t)
}
