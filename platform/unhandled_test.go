package platform

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func debugLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestUnhandledReadsAllOnes(t *testing.T) {
	u := NewUnhandled(nil, "pio")
	for _, n := range []int{1, 2, 4, 8} {
		d := make([]byte, n)
		u.Access(0x80, d, false)
		assert.Equal(t, bytes.Repeat([]byte{0xff}, n), d)
	}
	d := []byte{1, 2}
	u.Access(0x80, d, true)
	assert.Equal(t, []byte{1, 2}, d, "writes leave the data alone")
	u.Access(0x80, nil, false)
}

func TestUnhandledLogsOncePerAddress(t *testing.T) {
	var buf bytes.Buffer
	u := NewUnhandled(debugLogger(&buf), "mmio")
	for i := 0; i < 3; i++ {
		u.Access(0xfed00000, make([]byte, 4), false)
		u.Access(0xfed00000, []byte{0x34, 0x12, 0, 0}, true)
		u.Access(0xfed00004, []byte{0x78, 0x56}, true)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, "one line per distinct address:\n%s", buf.String())
	assert.Contains(t, lines[0], "level=DEBUG")
	assert.Contains(t, lines[0], "kind=mmio")
	assert.Contains(t, lines[0], "op=read")
	assert.Contains(t, lines[0], "addr=0xfed00000")
	assert.Contains(t, lines[0], "size=4")
	assert.Contains(t, lines[1], "op=write")
	assert.Contains(t, lines[1], "addr=0xfed00004")
	assert.Contains(t, lines[1], "value=0x5678")
}

func TestUnhandledNoAllocsAfterFirst(t *testing.T) {
	var buf bytes.Buffer
	u := NewUnhandled(debugLogger(&buf), "pio")
	d := make([]byte, 1)
	u.Access(0x61, d, false)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { u.Access(0x61, d, false) }))
	quiet := NewUnhandled(slog.New(slog.NewTextHandler(&buf, nil)), "pio") // info level
	assert.Zero(t, testing.AllocsPerRun(1000, func() { quiet.Access(0x62, d, false) }))
}

func TestUnhandledBoundedMemory(t *testing.T) {
	var buf bytes.Buffer
	u := NewUnhandled(debugLogger(&buf), "mmio")
	for a := uint64(0); a < maxLoggedAddrs+10; a++ {
		u.Access(a*4, make([]byte, 4), false)
	}
	lines := strings.Count(buf.String(), "\n")
	assert.Equal(t, maxLoggedAddrs+1, lines, "the limit is reported once, then logging stops")
	u.mu.Lock()
	defer u.mu.Unlock()
	assert.Len(t, u.seen, maxLoggedAddrs)
}

func BenchmarkUnhandledSeen(b *testing.B) {
	var buf bytes.Buffer
	u := NewUnhandled(debugLogger(&buf), "pio")
	d := make([]byte, 1)
	u.Access(0x61, d, false)
	b.ReportAllocs()
	for b.Loop() {
		u.Access(0x61, d, false)
	}
}
