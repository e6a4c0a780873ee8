package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// chunkReader hands out its chunks one Read at a time, as a terminal hands
// out one key (or one escape sequence) per read; a chunk larger than the
// caller's buffer is split, the rest kept for the next Read.
type chunkReader struct {
	chunks [][]byte
	err    error // returned once the chunks are gone; io.EOF when nil
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	return n, nil
}

// drain reads r to its end with a bufSize buffer, as the console and serial
// feeders do, failing the test on any n > len(p) (which makes the feeders
// index past their buffers) and on a reader that never ends.
func drain(t testing.TB, r io.Reader, bufSize int) ([]byte, error) {
	t.Helper()
	var out []byte
	p := make([]byte, bufSize)
	for i := 0; i < 1<<16; i++ {
		// Poison the buffer: a reader must not return bytes it did not write.
		for j := range p {
			p[j] = 0xee
		}
		n, err := r.Read(p)
		if n < 0 || n > len(p) {
			t.Fatalf("Read returned n=%d for a %d-byte buffer", n, len(p))
		}
		out = append(out, p[:n]...)
		if err != nil {
			return out, err
		}
	}
	t.Fatalf("reader did not end after 65536 reads; got %q so far", out)
	return nil, nil
}

// escapeModel is the documented console escape behaviour applied to a whole
// input at once: Ctrl-A x stops (nothing after it reaches the guest), Ctrl-A
// Ctrl-A sends one Ctrl-A, and a Ctrl-A before any other byte (or at the
// end of input) is passed on unchanged.
func escapeModel(in []byte) (out []byte, stopped bool) {
	out = []byte{}
	for i := 0; i < len(in); i++ {
		if in[i] != ctrlA {
			out = append(out, in[i])
			continue
		}
		if i+1 == len(in) {
			return append(out, ctrlA), false
		}
		switch in[i+1] {
		case 'x':
			return out, true
		case ctrlA:
			out = append(out, ctrlA)
			i++
		default:
			out = append(out, ctrlA)
		}
	}
	return out, false
}

func TestEscapeReaderTable(t *testing.T) {
	up := []byte("\x1b[A") // the up-arrow key: one read of three bytes
	for _, tc := range []struct {
		name    string
		chunks  [][]byte
		bufSize int
		want    string
		stopped bool
	}{
		{"plain text", [][]byte{[]byte("ls -l\r")}, 256, "ls -l\r", false},
		{"Ctrl-A then arrow key, separate reads", [][]byte{{ctrlA}, up}, 256, "\x01\x1b[A", false},
		{"Ctrl-A then arrow key, one read", [][]byte{append([]byte{ctrlA}, up...)}, 256, "\x01\x1b[A", false},
		{"Ctrl-A then arrow key, buffer exactly the key", [][]byte{{ctrlA}, up}, 3, "\x01\x1b[A", false},
		{"Ctrl-A then arrow key, one-byte buffer", [][]byte{{ctrlA}, up}, 1, "\x01\x1b[A", false},
		{"arrow keys around a lone Ctrl-A", [][]byte{up, {ctrlA}, up, up}, 4, "\x1b[A\x01\x1b[A\x1b[A", false},
		{"Ctrl-A Ctrl-A sends one Ctrl-A", [][]byte{{ctrlA, ctrlA, 'a'}}, 256, "\x01a", false},
		{"Ctrl-A Ctrl-A split across reads", [][]byte{{'a', ctrlA}, {ctrlA, 'b'}}, 256, "a\x01b", false},
		{"Ctrl-A Ctrl-A Ctrl-A x: literal, then stop", [][]byte{{ctrlA, ctrlA, ctrlA, 'x'}}, 256, "\x01", true},
		{"Ctrl-A x stops, later bytes dropped", [][]byte{[]byte("ab\x01xcd")}, 256, "ab", true},
		{"Ctrl-A x split across reads", [][]byte{[]byte("ab\x01"), []byte("xcd")}, 256, "ab", true},
		{"Ctrl-A X is not the escape", [][]byte{{ctrlA, 'X'}}, 256, "\x01X", false},
		{"lone Ctrl-A at end of input passes through", [][]byte{[]byte("a\x01")}, 256, "a\x01", false},
		{"full buffer of Ctrl-A b pairs", [][]byte{bytes.Repeat([]byte{ctrlA, 'b'}, 300)}, 256, string(bytes.Repeat([]byte{ctrlA, 'b'}, 300)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			escapes := 0
			r := &escapeReader{r: &chunkReader{chunks: tc.chunks}, escape: func() { escapes++ }}
			got, err := drain(t, r, tc.bufSize)
			assert.Equal(t, tc.want, string(got))
			assert.ErrorIs(t, err, io.EOF)
			want := 0
			if tc.stopped {
				want = 1
			}
			assert.Equal(t, want, escapes, "escape calls")
			n, err := r.Read(make([]byte, 8))
			assert.Equal(t, 0, n, "a Read after the end returns nothing")
			assert.ErrorIs(t, err, io.EOF, "and the end again")
		})
	}
}

// TestEscapeReaderPassesErrors: a read error reaches the feeder after the
// bytes read before it, and a Ctrl-A held back is not lost.
func TestEscapeReaderPassesErrors(t *testing.T) {
	boom := errors.New("tty gone")
	r := &escapeReader{r: &chunkReader{chunks: [][]byte{[]byte("ab\x01")}, err: boom}, escape: func() { t.Error("no escape was typed") }}
	got, err := drain(t, r, 2)
	assert.Equal(t, "ab\x01", string(got))
	assert.ErrorIs(t, err, boom)
}

// checkEscapeSplit feeds in, cut into the given chunk sizes, through an
// escapeReader read with a bufSize buffer, and compares with escapeModel.
func checkEscapeSplit(t testing.TB, in []byte, cuts []int, bufSize int) {
	t.Helper()
	var chunks [][]byte
	rest := in
	for _, c := range cuts {
		if len(rest) == 0 {
			break
		}
		c = min(c, len(rest))
		chunks = append(chunks, rest[:c])
		rest = rest[c:]
	}
	if len(rest) > 0 {
		chunks = append(chunks, rest)
	}
	escapes := 0
	r := &escapeReader{r: &chunkReader{chunks: chunks}, escape: func() { escapes++ }}
	got, err := drain(t, r, bufSize)
	want, stopped := escapeModel(in)
	if !bytes.Equal(got, want) || !errors.Is(err, io.EOF) || (escapes == 1) != stopped || escapes > 1 {
		t.Fatalf("input %q in chunks %v, buffer %d:\ngot  %q (err %v, %d escapes)\nwant %q (stopped %v)",
			in, cuts, bufSize, got, err, escapes, want, stopped)
	}
}

// TestEscapeReaderAnySplit is the property: for any input split into any
// chunks and read with any buffer size, the output is the input with only
// Ctrl-A x and Ctrl-A Ctrl-A handled, and no Read returns more than asked.
// Inputs are drawn from a small alphabet so Ctrl-A, x and escape-sequence
// bytes meet often.
func TestEscapeReaderAnySplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 1))
	alphabet := []byte{ctrlA, ctrlA, 'x', 'a', 0x1b, '[', 'A', 0}
	for range 20000 {
		in := make([]byte, rng.IntN(24))
		for i := range in {
			in[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cuts := make([]int, rng.IntN(8))
		for i := range cuts {
			cuts[i] = 1 + rng.IntN(6)
		}
		checkEscapeSplit(t, in, cuts, 1+rng.IntN(8))
	}
}

// FuzzEscapeReader explores the same property with arbitrary bytes: the
// first two bytes choose the buffer size and the chunking.
func FuzzEscapeReader(f *testing.F) {
	f.Add(byte(3), byte(1), []byte("\x01\x1b[A"))
	f.Add(byte(1), byte(0), []byte("\x01\x01\x01x"))
	f.Add(byte(255), byte(7), []byte("abc\x01"))
	f.Add(byte(2), byte(2), bytes.Repeat([]byte{ctrlA, 'b'}, 40))
	f.Fuzz(func(t *testing.T, buf, chunk byte, in []byte) {
		cuts := make([]int, len(in))
		for i := range cuts {
			cuts[i] = 1 + (int(chunk)+i*7)%(1+int(chunk)%9)
		}
		checkEscapeSplit(t, in, cuts, 1+int(buf)%64)
	})
}

func TestEscapeModel(t *testing.T) {
	// The model itself, on the cases the README documents.
	for in, want := range map[string]string{"a\x01xb": "a", "\x01\x01": "\x01", "\x01\x1b": "\x01\x1b", "\x01": "\x01"} {
		got, _ := escapeModel([]byte(in))
		require.Equal(t, want, string(got), "%q", in)
	}
}

// openPTY returns both ends of a new pseudo-terminal: the terminal handling
// is tested on a real tty, not a fake.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here (/dev/ptmx: %v)", err)
	}
	t.Cleanup(func() { ptm.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0), "unlockpt")
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	require.NoError(t, err, "ptsname")
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}

// TestConsoleTerminal: on a terminal stdin goes through the escape reader
// and raw mode is switched on and back off; anything else passes unchanged;
// the size is the terminal's.
func TestConsoleTerminal(t *testing.T) {
	ptm, pts := openPTY(t)
	require.NoError(t, unix.IoctlSetWinsize(int(ptm.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 132}))
	rows, cols := terminalSize(pts)
	assert.Equal(t, [2]uint16{50, 132}, [2]uint16{rows, cols})

	in, fd := consoleInput(pts, func() {})
	assert.IsType(t, &escapeReader{}, in)
	assert.Equal(t, int(pts.Fd()), fd)
	lflag := func() uint32 {
		tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		require.NoError(t, err)
		return tio.Lflag
	}
	require.NotZero(t, lflag()&unix.ICANON, "a new pty starts in canonical mode")
	restore := makeRaw(fd, slog.New(slog.DiscardHandler))
	assert.Zero(t, lflag()&(unix.ICANON|unix.ECHO|unix.ISIG), "raw: no line editing, echo or signal keys")
	restore()
	assert.NotZero(t, lflag()&unix.ICANON, "restored")

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	in, fd = consoleInput(r, func() {})
	assert.Same(t, r, in, "a pipe passes through unchanged")
	assert.Equal(t, -1, fd)
	rows, cols = terminalSize(w)
	assert.Equal(t, [2]uint16{0, 0}, [2]uint16{rows, cols}, "a pipe has no size")
}
