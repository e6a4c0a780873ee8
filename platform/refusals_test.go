package platform

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRefusalsRateLimitPerKind(t *testing.T) {
	var buf bytes.Buffer
	r := NewRefusals(slog.New(slog.NewTextHandler(&buf, nil)), time.Second)
	now := time.Unix(1000, 0)
	r.SetClock(func() time.Time { return now })
	bad := errors.New("BAR0 at 0x100000 over guest RAM")

	assert.True(t, r.Refuse("pci", bad), "the first refusal of a kind is logged")
	for i := 0; i < 10000; i++ {
		assert.False(t, r.Refuse("pci", bad))
	}
	assert.True(t, r.Refuse("virtio-net tap0", errors.New("loop")), "another kind has its own limit")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, "10,002 refusals in one instant: one line per kind\n%s", buf.String())
	assert.Contains(t, lines[0], "kind=pci")
	assert.Contains(t, lines[0], "over guest RAM")
	assert.Contains(t, lines[0], "suppressed_since_last=0")

	now = now.Add(999 * time.Millisecond)
	assert.False(t, r.Refuse("pci", bad), "still inside the interval")
	now = now.Add(time.Millisecond)
	assert.True(t, r.Refuse("pci", bad), "an interval after the last line")
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	assert.Contains(t, lines[2], "suppressed_since_last=10001", "the line counts what was not logged")
	assert.Equal(t, uint64(10003), r.Count("pci"))

	for i := 0; i < 5; i++ {
		r.Refuse("pci", bad)
	}
	r.Flush()
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4)
	assert.Contains(t, lines[3], "suppressed=5")
	assert.Contains(t, lines[3], "total=10008")
	r.Flush()
	assert.Len(t, strings.Split(strings.TrimSpace(buf.String()), "\n"), 4, "nothing left to flush")
}

func TestRefusalsBoundsKinds(t *testing.T) {
	var buf bytes.Buffer
	r := NewRefusals(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	for i := 0; i < maxRefusalKinds+100; i++ {
		r.Refuse(fmt.Sprintf("kind%d", i), errors.New("x"))
	}
	r.mu.Lock()
	kinds := len(r.kinds)
	r.mu.Unlock()
	assert.LessOrEqual(t, kinds, maxRefusalKinds+1)
	assert.Equal(t, uint64(100), r.Count("other"), "kinds past the bound share one")
	assert.Equal(t, maxRefusalKinds+1, strings.Count(buf.String(), "\n"))
}
