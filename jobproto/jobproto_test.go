package jobproto

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// samples are one of each message, with the awkward values: non-UTF-8
// argv, empty strings inside lists, IPv4 and IPv6, the largest numbers.
func samples() []Message {
	_, v4, _ := net.ParseCIDR("10.0.0.2/24")
	v4.IP = net.ParseIP("10.0.0.2").To4()
	_, v6, _ := net.ParseCIDR("fd00::2/64")
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	return []Message{
		&Start{
			Argv: []string{"sh", "-c", "echo \xff\xfe; exit 7", ""}, Env: []string{"PATH=/bin", "A="},
			Workdir: "/tmp", SetUser: true, UID: 1<<32 - 1, GID: 100, TTY: true, Rows: 65535, Cols: 80,
			Hostname: "node-1",
			Interfaces: []Interface{
				{MAC: mac, Address: v4, Gateway: net.ParseIP("10.0.0.1").To4()},
				{MAC: mac, DHCP: true},
				{Address: v6, Gateway: net.ParseIP("fd00::1")},
			},
			DNS:           []net.IP{net.ParseIP("1.1.1.1").To4(), net.ParseIP("::1")},
			HugePageSizes: []uint64{2 << 20, 1 << 30},
			StopGrace:     1500 * time.Millisecond,
			PMI:           true,
			Groups:        []uint32{0, 27, 1<<32 - 1},
			UserName:      "alice", GroupName: "alice", Home: "/home/alice",
			Mounts: []Mount{
				{Port: "org.hpcvmm.9p.0", Target: "/home/alice", MSize: 512 << 10, Cache: "none"},
				{Port: "org.hpcvmm.9p.1", Target: "/data", ReadOnly: true},
			},
			GPUs: MaxGPUs,
		},
		&Start{Argv: []string{"nvidia-smi"}, GPUs: 1},
		&Start{Argv: []string{"true"}},
		&Signal{Signo: uint8(syscall.SIGTERM)},
		&Signal{Signo: 64},
		&Resize{Rows: 24, Cols: 80},
		&Ready{},
		&Started{PID: 1<<32 - 1},
		&Exited{Code: 7},
		&Exited{Signal: 15},
		&Exited{},
		&Failed{Kind: FailNotFound, Reason: "nosuch: not found in PATH /bin"},
		&Failed{Kind: FailAgent},
		&Log{Text: "mounting hugetlbfs: ENODEV"},
	}
}

func TestRoundTrip(t *testing.T) {
	var stream bytes.Buffer
	for _, m := range samples() {
		require.NoError(t, Write(&stream, m))
	}
	r := NewReader(&stream, MaxFrame)
	for _, want := range samples() {
		got, err := r.Read()
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := r.Read()
	require.ErrorIs(t, err, io.EOF)
}

// A stream cut anywhere yields the messages of the complete frames before
// the cut, then an error: io.EOF at a frame boundary, io.ErrUnexpectedEOF
// inside one; never a wrong or partial message.
func TestCutStream(t *testing.T) {
	var stream []byte
	var ends []int
	for _, m := range samples() {
		var err error
		stream, err = AppendFrame(stream, m)
		require.NoError(t, err)
		ends = append(ends, len(stream))
	}
	for cut := 0; cut <= len(stream); cut++ {
		r := NewReader(bytes.NewReader(stream[:cut]), MaxFrame)
		want := samples()
		complete := 0
		for complete < len(ends) && ends[complete] <= cut {
			complete++
		}
		for i := 0; i < complete; i++ {
			got, err := r.Read()
			require.NoError(t, err, "cut %d frame %d", cut, i)
			require.Equal(t, want[i], got)
		}
		_, err := r.Read()
		if complete > 0 && ends[complete-1] == cut || cut == 0 {
			require.ErrorIs(t, err, io.EOF, "cut %d", cut)
		} else {
			require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut %d", cut)
		}
	}
}

func TestBounds(t *testing.T) {
	// A frame over the reader's bound is refused from its header alone:
	// the reader must not read (or allocate) its body.
	hdr := []byte{0, 1, 0, 1} // 65537 bytes
	r := NewReader(io.MultiReader(bytes.NewReader(hdr), failingReader{t}), MaxGuestFrame)
	_, err := r.Read()
	require.ErrorIs(t, err, ErrFrameTooLarge)

	// The writer refuses a Start beyond MaxFrame.
	big := &Start{Argv: []string{string(make([]byte, MaxFrame))}}
	_, err = AppendFrame(nil, big)
	require.ErrorIs(t, err, ErrFrameTooLarge)

	for _, frame := range [][]byte{
		{}, {Version}, {2, byte(TypeReady)}, {Version, 99}, {Version, byte(TypeReady), 0},
		{Version, byte(TypeSignal), 0}, {Version, byte(TypeSignal), 65},
		{Version, byte(TypeExited), 1, 9}, {Version, byte(TypeFailed), 9, 0},
		{Version, byte(TypeStarted), 0x80, 0x00},                 // varint not shortest
		{Version, byte(TypeLog), 5, 'a'},                         // string longer than the body
		{Version, byte(TypeStart), 0xff, 0xff, 0xff, 0xff, 0x0f}, // 4 G strings announced
	} {
		_, err := Decode(frame)
		require.ErrorIs(t, err, ErrMalformed, "frame %x", frame)
	}
}

// TestStartGPUsCompatible: a Start without GPUs encodes as it did before
// the field (the bytes of a version-1 agent's frame, so either side may be
// the older), GPUs is encoded as a trailing uvarint only when not 0, and
// the decoder refuses a spelt-out 0, a count over MaxGPUs and anything
// after it.
func TestStartGPUsCompatible(t *testing.T) {
	// The frame of Start{Argv: ["true"]} as version 1 always wrote it:
	// argv, env, workdir, setuser, uid, gid, tty, rows, cols, hostname,
	// interfaces, dns, hugepages, stop grace, pmi, groups, user name,
	// group name, home, mounts.
	old := []byte{Version, byte(TypeStart), 1, 4, 't', 'r', 'u', 'e', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	b, err := AppendFrame(nil, &Start{Argv: []string{"true"}})
	require.NoError(t, err)
	require.Equal(t, old, b[headerLen:])
	m, err := Decode(old)
	require.NoError(t, err)
	require.Zero(t, m.(*Start).GPUs)

	b, err = AppendFrame(nil, &Start{Argv: []string{"true"}, GPUs: 8})
	require.NoError(t, err)
	require.Equal(t, append(append([]byte{}, old...), 8), b[headerLen:])
	m, err = Decode(b[headerLen:])
	require.NoError(t, err)
	require.Equal(t, uint32(8), m.(*Start).GPUs)

	for _, tail := range [][]byte{{0}, {0x80, 0x02} /* 256 */, {1, 0}, {0x81, 0x00} /* not shortest */} {
		_, err := Decode(append(append([]byte{}, old...), tail...))
		require.ErrorIs(t, err, ErrMalformed, "tail %x", tail)
	}
}

type failingReader struct{ t *testing.T }

func (f failingReader) Read([]byte) (int, error) {
	f.t.Error("read beyond a refused frame header")
	return 0, io.ErrUnexpectedEOF
}

func TestStatus(t *testing.T) {
	for _, c := range []struct {
		s    Status
		code int
	}{
		{Status{Code: 0}, 0},
		{Status{Code: 7}, 7},
		{Status{Code: 255}, 255},
		{Status{Signal: syscall.SIGTERM}, 143},
		{Status{Signal: syscall.SIGKILL}, 137},
		{Status{Failure: FailNotFound, Reason: "x"}, 127},
		{Status{Failure: FailNotExecutable}, 126},
		{Status{Failure: FailAgent}, 125},
	} {
		require.Equal(t, c.code, c.s.ExitCode(), "%v", c.s)
	}
	require.Equal(t, Status{Signal: syscall.SIGTERM}, StatusOf(&Exited{Signal: 15}))
	require.Equal(t, Status{Code: 3}, StatusOf(&Exited{Code: 3}))
	// Wait statuses as the kernel encodes them: exit code in bits 8-15,
	// the signal in bits 0-6.
	require.Equal(t, Exited{Code: 7}, ExitedFrom(syscall.WaitStatus(7<<8)))
	require.Equal(t, Exited{Signal: 9}, ExitedFrom(syscall.WaitStatus(9)))
	require.Equal(t, Exited{Signal: 6}, ExitedFrom(syscall.WaitStatus(6|0x80))) // core dumped
}

// FuzzDecode: any frame content either fails with ErrMalformed or decodes
// to a message whose encoding is exactly that content (the encoding is
// canonical, so decode∘encode and encode∘decode are identities), and the
// Reader never reads past the frame it was given, whatever follows.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		b, err := AppendFrame(nil, m)
		require.NoError(f, err)
		f.Add(b[headerLen:])
	}
	f.Add([]byte{Version, byte(TypeStart), 1, 0xff})
	f.Fuzz(func(t *testing.T, content []byte) {
		m, err := Decode(content)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := AppendFrame(nil, m)
		if err != nil {
			t.Fatalf("re-encoding %#v: %v", m, err)
		}
		if !bytes.Equal(again[headerLen:], content) {
			t.Fatalf("re-encoded %x, decoded from %x", again[headerLen:], content)
		}
		m2, err := Decode(again[headerLen:])
		require.NoError(t, err)
		require.Equal(t, m, m2)

		// Through a Reader, with a trailing sentinel frame that must
		// still be there afterwards (nothing read beyond the frame).
		stream := append([]byte(nil), again...)
		stream, _ = AppendFrame(stream, &Log{Text: "sentinel"})
		r := NewReader(bytes.NewReader(stream), MaxFrame)
		m3, err := r.Read()
		require.NoError(t, err)
		require.Equal(t, m, m3)
		s, err := r.Read()
		require.NoError(t, err)
		require.Equal(t, &Log{Text: "sentinel"}, s)
	})
}
