// Package termsafe makes a guest's console output safe to show on the
// user's terminal. hpcvmm copies the guest's console bytes to its stdout;
// on a terminal those bytes are commands too: an OSC sets the window title
// or, with OSC 52, the user's clipboard; a DCS, APC, PM or SOS string
// reaches terminal extensions (tmux passthrough, sixel, kitty graphics);
// a CSI can ask the terminal to answer into hpcvmm's stdin (device status
// and attribute reports, window title reports), switch mouse reporting,
// the alternate screen or bracketed paste, resize the window; ESC c
// resets it, SO and ESC ( 0 switch it to line drawing. A compromised or
// buggy guest should not reach any of that (issue 23).
//
// # Policy
//
// Writer passes:
//   - printable ASCII and well-formed UTF-8, except the UTF-8 encodings of
//     the C1 controls (U+0080–U+009F: some terminals read U+009B as CSI);
//   - LF, CR, TAB and BS, the controls of plain line output;
//   - CSI sequences with numeric parameters (digits, ';', and ':' in SGR)
//     and no intermediate bytes, whose final byte is one of: m (SGR:
//     colours, bold, underline), A–H, f, d (cursor movement and
//     positioning), J and K with parameter 0, 1 or 2 (erase in display or
//     line; 3 would erase the user's scrollback), @, P, X, L, M (insert
//     and delete characters and lines, as line editors use). Each is
//     written whole in one Write to the terminal or not at all, and at
//     most maxCSI bytes long.
//
// Everything else is dropped: every other C0 control (BEL, SO, SI, ENQ
// ...) and DEL, raw bytes 0x80–0xFF that are not part of well-formed
// UTF-8 (8-bit C1 controls among them), ESC sequences other than the
// CSIs above (with their intermediates and final byte), CSIs with a
// private marker (ESC [ ? ...) or any other final byte, and the whole
// string of OSC, DCS, SOS, PM and APC up to its terminator (BEL, ESC \,
// or CAN/SUB, which abort a sequence as in ECMA-48). A control that
// arrives inside an escape sequence aborts the sequence, as do ESC, CAN
// and SUB. Terminals are assumed to decode UTF-8 (the Linux console and
// today's emulators do); a terminal set to an 8-bit charset may still
// read a continuation byte 0x80–0x9F of well-formed UTF-8 as a C1
// control.
//
// Writer is meant for a terminal only: output to a file or a pipe stays
// the guest's raw bytes, and so does a job's stdout (it is data, not
// console output). `hpcvmm run --console-raw` turns the filter off.
//
// A Write allocates nothing: the state between Writes (an escape sequence
// or a UTF-8 character cut by a chunk boundary) and the output buffer are
// fixed arrays in the Writer. The UART writes one byte per Write, the
// virtio console a chunk; both may share one Writer (it locks).
package termsafe

import (
	"io"
	"sync"
	"unicode/utf8"
)

// maxCSI bounds an allowed CSI sequence held until its final byte: longer
// ones are dropped. SGR with 24-bit colours for foreground and background
// with attributes ("\x1b[0;1;38;2;255;255;255;48;2;255;255;255m", 40
// bytes) fits.
const maxCSI = 64

// outSize is the output buffer: one write to the terminal per Write of up
// to this many bytes.
const outSize = 4096

type state uint8

const (
	ground   state = iota
	utf8Seq        // inside a multi-byte UTF-8 character (held)
	escape         // after ESC
	escInter       // ESC and intermediate bytes: dropped up to the final byte
	csi            // ESC [ with parameters so far (held)
	csiDrop        // a CSI being dropped up to its final byte
	str            // inside an OSC/DCS/SOS/PM/APC string: dropped
	strEsc         // ESC inside such a string: ST if '\' follows
)

// C0 controls and bytes the state machine tests.
const (
	bs  = 0x08
	tab = 0x09
	lf  = 0x0a
	cr  = 0x0d
	bel = 0x07
	can = 0x18
	sub = 0x1a
	esc = 0x1b
	del = 0x7f
)

// Writer filters what is written to it (see the package doc) and writes
// the rest to the underlying writer.
type Writer struct {
	mu   sync.Mutex
	w    io.Writer
	st   state
	need int           // continuation bytes still expected in utf8Seq
	held [maxCSI]byte  // the CSI or UTF-8 character being collected
	nh   int           // bytes in held
	out  [outSize]byte // filtered output of the current Write
	no   int           // bytes in out
}

// NewWriter returns a Writer that writes the filtered bytes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write filters p and writes what remains to the underlying writer, in
// one Write per outSize bytes of output. It reports len(p) when the
// underlying writes succeed: the dropped bytes count as written.
func (t *Writer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := 0; i < len(p); {
		if t.st == ground {
			// Runs of printable ASCII, most of a console's output, are
			// copied as they are.
			j := i
			for j < len(p) && p[j] >= 0x20 && p[j] < del && t.no+(j-i) < outSize {
				j++
			}
			t.no += copy(t.out[t.no:], p[i:j])
			i = j
		}
		if i < len(p) && t.no < outSize-2*maxCSI {
			t.step(p[i])
			i++
		}
		if t.no >= outSize-2*maxCSI {
			if err := t.flush(); err != nil {
				return i, err
			}
		}
	}
	if err := t.flush(); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (t *Writer) flush() error {
	if t.no == 0 {
		return nil
	}
	_, err := t.w.Write(t.out[:t.no])
	t.no = 0
	return err
}

func (t *Writer) emit(b byte) {
	t.out[t.no] = b
	t.no++
}

func (t *Writer) hold(b byte) {
	t.held[t.nh] = b
	t.nh++
}

// step advances the state machine by one input byte.
func (t *Writer) step(b byte) {
	switch t.st {
	case ground:
		t.ground(b)
	case utf8Seq:
		if b >= 0x80 && b <= 0xbf {
			t.hold(b)
			if t.need--; t.need == 0 {
				r, n := utf8.DecodeRune(t.held[:t.nh])
				if r != utf8.RuneError && n == t.nh && r > 0x9f {
					for _, c := range t.held[:t.nh] {
						t.emit(c)
					}
				}
				t.nh, t.st = 0, ground
			}
			return
		}
		t.nh, t.st = 0, ground // a broken character is dropped
		t.ground(b)
	case escape:
		t.escape(b)
	case escInter:
		switch {
		case b >= 0x20 && b <= 0x2f, b == del:
		case b >= 0x30 && b <= 0x7e:
			t.st = ground
		default:
			t.abort(b)
		}
	case csi:
		t.csi(b)
	case csiDrop:
		switch {
		case b >= 0x20 && b <= 0x3f, b == del:
		case b >= 0x40 && b <= 0x7e:
			t.st = ground
		default:
			t.abort(b)
		}
	case str:
		switch b {
		case bel, can, sub:
			t.st = ground
		case esc:
			t.st = strEsc
		}
	case strEsc:
		if b == '\\' {
			t.st = ground
			return
		}
		t.st = escape
		t.escape(b)
	}
}

// abort ends the sequence being read at byte b, which is not part of it:
// ESC starts a new one, CAN and SUB only end it, anything else is read in
// the ground state.
func (t *Writer) abort(b byte) {
	t.nh = 0
	switch b {
	case esc:
		t.st = escape
	case can, sub:
		t.st = ground
	default:
		t.st = ground
		t.ground(b)
	}
}

func (t *Writer) ground(b byte) {
	switch {
	case b >= 0x20 && b < del, b == lf, b == cr, b == tab, b == bs:
		t.emit(b)
	case b == esc:
		t.st = escape
	case b >= 0xc2 && b <= 0xdf:
		t.hold(b)
		t.need, t.st = 1, utf8Seq
	case b >= 0xe0 && b <= 0xef:
		t.hold(b)
		t.need, t.st = 2, utf8Seq
	case b >= 0xf0 && b <= 0xf4:
		t.hold(b)
		t.need, t.st = 3, utf8Seq
	}
	// Other C0 controls, DEL, stray continuation bytes (8-bit C1 among
	// them) and bytes that never start UTF-8: dropped.
}

func (t *Writer) escape(b byte) {
	switch {
	case b == '[':
		t.nh = 0
		t.hold(esc)
		t.hold('[')
		t.st = csi
	case b == ']', b == 'P', b == 'X', b == '^', b == '_':
		t.st = str
	case b >= 0x20 && b <= 0x2f:
		t.st = escInter
	case b >= 0x30 && b <= 0x7e:
		t.st = ground // a two-byte escape (ESC c, ESC 7, ESC =): dropped
	case b == del:
	default:
		t.abort(b)
	}
}

func (t *Writer) csi(b byte) {
	switch {
	case b >= '0' && b <= '9', b == ';', b == ':':
		if t.nh == maxCSI-1 {
			t.nh, t.st = 0, csiDrop
			return
		}
		t.hold(b)
	case b >= 0x3c && b <= 0x3f, b >= 0x20 && b <= 0x2f:
		// A private marker (< = > ?) or an intermediate byte.
		t.nh, t.st = 0, csiDrop
	case b >= 0x40 && b <= 0x7e:
		if allowed(t.held[2:t.nh], b) {
			for _, c := range t.held[:t.nh] {
				t.emit(c)
			}
			t.emit(b)
		}
		t.nh, t.st = 0, ground
	case b == del:
	default:
		t.abort(b)
	}
}

// allowed reports whether CSI params final may reach the terminal.
func allowed(params []byte, final byte) bool {
	switch final {
	case 'm':
		return true
	case 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'f', 'd', '@', 'P', 'X', 'L', 'M':
	case 'J', 'K':
		// Erase below, above or all of the display or line; not 3 (the
		// scrollback).
		if len(params) > 1 || (len(params) == 1 && params[0] > '2') {
			return false
		}
	default:
		return false
	}
	for _, c := range params {
		if c == ':' {
			return false // sub-parameters are SGR's
		}
	}
	return true
}
