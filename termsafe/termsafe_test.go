package termsafe

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func filter(in string) string {
	var b bytes.Buffer
	w := NewWriter(&b)
	_, _ = w.Write([]byte(in))
	return b.String()
}

func TestPolicy(t *testing.T) {
	for _, c := range []struct{ in, want, why string }{
		{"hello, world\r\n", "hello, world\r\n", "text and line controls"},
		{"a\tb\bc", "a\tb\bc", "tab and backspace"},
		{"grüße ✓ 🚀\n", "grüße ✓ 🚀\n", "UTF-8"},
		{"\x1b[1;31mred\x1b[0m", "\x1b[1;31mred\x1b[0m", "SGR colour"},
		{"\x1b[38;2;255;0;0mx\x1b[38:2::255:0:0my", "\x1b[38;2;255;0;0mx\x1b[38:2::255:0:0my", "24-bit colour, both notations"},
		{"\x1b[2J\x1b[H\x1b[K\x1b[10;5H\x1b[3A", "\x1b[2J\x1b[H\x1b[K\x1b[10;5H\x1b[3A", "clear, home, cursor movement"},
		{"\x1b[3Jx", "x", "erase scrollback"},
		{"a\x1b]0;pwned title\x07b", "ab", "OSC title, BEL-terminated"},
		{"a\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x1b\\b", "ab", "OSC 52 clipboard, ST-terminated"},
		{"a\x1bP+q544e\x1b\\b", "ab", "DCS (XTGETTCAP)"},
		{"a\x1b_Gf=100;AAAA\x1b\\b", "ab", "APC (kitty graphics)"},
		{"a\x1b^pm\x1b\\b\x1bXsos\x1b\\c", "abc", "PM and SOS"},
		{"a\x1b]0;x\x18b", "ab", "CAN aborts a string"},
		{"\x1b[6n\x1b[c\x1b[>c\x1b[21t\x1b[8;1;1t", "", "reports that answer into stdin, window ops"},
		{"\x1b[?1049h\x1b[?1000h\x1b[?2004l\x1b[?25l\x1b[4h\x1b[1;2r", "", "private modes, modes, scroll region"},
		{"\x1bc\x1b7\x1b8\x1b(0\x1b)B\x1b#8\x1b=x", "x", "ESC sequences: reset, cursor save, charsets, alignment test, keypad"},
		{"\x07\x0e\x0f\x05\x00\x7fz", "z", "BEL, SO, SI, ENQ, NUL, DEL"},
		{"a\xc2\x9b6nb", "a6nb", "UTF-8 encoded C1 CSI"},
		{"a\x9b6n\x9d0;t\x07b", "a6n0;tb", "raw 8-bit C1"},
		{"a\xffb\xc0\xafc\xed\xa0\x80d", "abcd", "bytes that are not UTF-8: invalid, overlong, surrogate"},
		{"\x1b[31\nm", "\nm", "a control aborts a CSI"},
		{"\x1b[" + strings.Repeat("1;", 40) + "mx", "x", "an SGR longer than maxCSI"},
		{"\x1b[1\x1b]0;t\x07x", "x", "ESC inside a CSI starts a new sequence"},
		{"\x1b]0;t\x1b[31mx", "\x1b[31mx", "ESC inside a string not followed by \\ starts a new sequence"},
	} {
		assert.Equal(t, c.want, filter(c.in), "%s: %q", c.why, c.in)
	}
}

// TestSplitAnywhere: a sequence or a character cut by a Write boundary is
// filtered as if whole (the UART writes one byte at a time).
func TestSplitAnywhere(t *testing.T) {
	in := "ok \x1b[1;32mgreen\x1b[0m \x1b]52;c;ZXZpbA==\x07é🚀\x1b[6n\x1bP1$r\x1b\\end\n"
	want := filter(in)
	assert.Equal(t, "ok \x1b[1;32mgreen\x1b[0m é🚀end\n", want)
	for cut := 1; cut < len(in); cut++ {
		var b bytes.Buffer
		w := NewWriter(&b)
		n, err := w.Write([]byte(in[:cut]))
		require.NoError(t, err)
		require.Equal(t, cut, n)
		_, _ = w.Write([]byte(in[cut:]))
		assert.Equal(t, want, b.String(), "cut at %d", cut)
	}
	var b bytes.Buffer
	w := NewWriter(&b)
	for i := range len(in) {
		_, _ = w.Write([]byte{in[i]})
	}
	assert.Equal(t, want, b.String(), "one byte per Write")
}

// TestNeverAPartialSequence: what reaches the terminal after each Write is
// whole: an allowed CSI is held until its final byte, so another writer's
// bytes can never complete it into something else.
func TestNeverAPartialSequence(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	for _, c := range []byte("x\x1b[1;3") {
		_, _ = w.Write([]byte{c})
		assert.NotContains(t, b.String(), "\x1b", "nothing of the CSI yet")
	}
	_, _ = w.Write([]byte("1m"))
	assert.Equal(t, "x\x1b[1;31m", b.String())
}

type failWriter struct{ err error }

func (f failWriter) Write(p []byte) (int, error) { return 0, f.err }

func TestWriteError(t *testing.T) {
	boom := errors.New("EIO")
	w := NewWriter(failWriter{boom})
	_, err := w.Write([]byte("text"))
	assert.ErrorIs(t, err, boom)
	n, err := w.Write([]byte("\x1b]0;dropped only\x07"))
	require.NoError(t, err, "nothing to write")
	assert.Equal(t, 17, n)
}

// checkSafe asserts the property of every output: ESC only as the start
// of an allowed CSI, no C0 control but LF, CR, TAB and BS, no DEL, and
// well-formed UTF-8 without C1 controls.
func checkSafe(t *testing.T, out []byte) {
	t.Helper()
	require.True(t, utf8.Valid(out), "UTF-8: %q", out)
	for i := 0; i < len(out); i++ {
		c := out[i]
		switch {
		case c == 0x1b:
			require.Less(t, i+1, len(out), "a lone ESC at the end: %q", out)
			require.Equal(t, byte('['), out[i+1], "ESC not followed by [ (OSC, DCS, APC...): %q", out)
			j := i + 2
			for j < len(out) && (out[j] >= '0' && out[j] <= '9' || out[j] == ';' || out[j] == ':') {
				j++
			}
			require.Less(t, j, len(out), "an unterminated CSI: %q", out)
			require.True(t, allowed(out[i+2:j], out[j]), "CSI %q is not allowed", out[i:j+1])
			require.LessOrEqual(t, j+1-i, maxCSI, "CSI too long")
			i = j
		case c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\b', c == 0x7f:
			require.Fail(t, "control in the output", "%#x in %q", c, out)
		}
	}
	for _, r := range string(out) {
		require.False(t, r >= 0x80 && r <= 0x9f, "C1 control U+%04X in %q", r, out)
	}
}

// plain keeps what the filter must pass as text: well-formed UTF-8 without
// control characters but LF, CR, TAB and BS.
func plain(b []byte) []byte {
	var out []byte
	for _, r := range strings.ToValidUTF8(string(b), "") {
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' && r != '\b' || r >= 0x7f && r <= 0x9f {
			continue
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// stringBody keeps what cannot end an OSC/DCS/APC/PM/SOS string early.
func stringBody(b []byte) []byte {
	var out []byte
	for _, c := range b {
		if c != bel && c != esc && c != can && c != sub {
			out = append(out, c)
		}
	}
	return out
}

var introducers = []string{"\x1b]", "\x1bP", "\x1b_", "\x1b^", "\x1bX"}

// FuzzWriter: any input, cut into any Writes, gives safe output (checkSafe),
// the same as in one Write; and text around a dropped string sequence
// (OSC, DCS, APC, PM, SOS with any body and either terminator) comes out,
// every character in order, and nothing of the sequence.
func FuzzWriter(f *testing.F) {
	f.Add([]byte("a\x1b]52;c;ZXZpbA==\x07b\x1b[31mc"), uint8(3), []byte("before "), []byte("0;title"), []byte(" after"), uint8(0))
	f.Add([]byte("\xc2\x9b6n\x9b\x1bP\x1b\\\x1b[?25l"), uint8(1), []byte("é"), []byte("+q544e"), []byte("\\"), uint8(7))
	f.Fuzz(func(t *testing.T, in []byte, cut uint8, before, body, after []byte, kind uint8) {
		var whole bytes.Buffer
		_, _ = NewWriter(&whole).Write(in)
		checkSafe(t, whole.Bytes())

		var split bytes.Buffer
		w := NewWriter(&split)
		step := 1 + int(cut)%17
		for i := 0; i < len(in); i += step {
			_, _ = w.Write(in[i:min(i+step, len(in))])
		}
		assert.Equal(t, whole.Bytes(), split.Bytes(), "the same output however the input is cut")

		before, after = plain(before), plain(after)
		end := "\x07"
		if kind&8 != 0 {
			end = "\x1b\\"
		}
		seq := introducers[int(kind)%len(introducers)] + string(stringBody(body)) + end
		var b bytes.Buffer
		_, _ = NewWriter(&b).Write([]byte(string(before) + seq + string(after)))
		assert.Equal(t, string(before)+string(after), b.String())
	})
}

// bootLog is console output as a guest prints it: kernel lines, and
// systemd's status lines with colours.
var bootLog = []byte(strings.Repeat("[    0.123456] pci 0000:00:0a.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint\r\n"+
	"[  \x1b[0;32m OK \x1b[0m] Started \x1b[0;1;39msystemd-journald.service\x1b[0m - Journal Service.\r\n", 30)[:4096])

// BenchmarkWriter: a 4 KiB chunk of console output through the filter
// allocates nothing.
func BenchmarkWriter(b *testing.B) {
	w := NewWriter(discard{})
	b.SetBytes(int64(len(bootLog)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Write(bootLog); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriterByte: the UART's one byte per Write.
func BenchmarkWriterByte(b *testing.B) {
	w := NewWriter(discard{})
	b.SetBytes(1)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := w.Write(bootLog[i : i+1]); err != nil {
			b.Fatal(err)
		}
		i = (i + 1) % len(bootLog)
	}
}

// discard is io.Discard without its ReaderFrom: a plain Write.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestAllocs(t *testing.T) {
	w := NewWriter(discard{})
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = w.Write(bootLog) }))
}

// TestLargeWrite: a Write larger than the output buffer is written in
// several underlying Writes, with the same bytes as one byte at a time.
func TestLargeWrite(t *testing.T) {
	in := bytes.Repeat(append(append([]byte{}, bootLog...), "\x1b]0;t\x07\x1b[1;31m"+strings.Repeat("é", 3000)+"\x1b[0m"...), 3)
	var whole, bytewise bytes.Buffer
	n, err := NewWriter(&whole).Write(in)
	require.NoError(t, err)
	assert.Equal(t, len(in), n)
	w := NewWriter(&bytewise)
	for i := range in {
		_, _ = w.Write(in[i : i+1])
	}
	assert.Equal(t, bytewise.String(), whole.String())
	assert.Equal(t, len(in)-3*len("\x1b]0;t\x07"), whole.Len())
	checkSafe(t, whole.Bytes())
}
