package harness

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWatchProgressFiresOnlyWhenNothingGrows(t *testing.T) {
	dir := t.TempDir()
	r := &l1Run{consolePath: filepath.Join(dir, "console"), resultsPath: filepath.Join(dir, "results")}
	require.NoError(t, os.WriteFile(r.consolePath, nil, 0o644))
	fired := make(chan struct{})
	stop := watchProgress(r, 400*time.Millisecond, func() { close(fired) })
	defer stop()
	// Growing output keeps the watchdog quiet.
	for i := 0; i < 6; i++ {
		time.Sleep(150 * time.Millisecond)
		f, err := os.OpenFile(r.consolePath, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, _ = f.WriteString("line\n")
		f.Close()
		select {
		case <-fired:
			t.Fatal("watchdog fired while the console was growing")
		default:
		}
	}
	select {
	case <-fired:
	case <-time.After(3 * time.Second):
		assert.Fail(t, "watchdog did not fire after output stopped")
	}
}
