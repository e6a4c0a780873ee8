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

func TestRetrySkipRerunsOnlyWhatALostBootLeftOpen(t *testing.T) {
	res := &Results{Tests: map[string]*TestResult{
		"TestBootStockKernel":                   {Status: StatusPass},
		"TestCheckPassthrough":                  {Status: StatusSkip}, // another profile's
		"TestNetworkPingAndTransfer":            {Status: StatusRun},  // the one L1 hung in
		"TestNetworkPingAndTransfer/vhost=on":   {Status: StatusRun},
		"TestConsoleRoundTrip":                  {Status: StatusFail},
		"TestGuestRAMOnHugepagesAndPinnedVCPUs": {Status: ""}, // values only
	}}
	stalled := &l1Run{stalled: true, results: res}
	skip, ok := retrySkip(stalled, "")
	assert.True(t, ok)
	assert.Equal(t, "^(TestBootStockKernel|TestCheckPassthrough|TestConsoleRoundTrip)$", skip)

	skip, ok = retrySkip(stalled, "TestSlow")
	assert.True(t, ok)
	assert.Equal(t, "(?:TestSlow)|^(TestBootStockKernel|TestCheckPassthrough|TestConsoleRoundTrip)$", skip)

	_, ok = retrySkip(stalled, "TestX/sub")
	assert.False(t, ok, "a per-level skip pattern cannot be joined")
	finishedRes := *res
	finishedRes.L1 = map[string]map[string]string{"exit": {"code": "1"}}
	_, ok = retrySkip(&l1Run{results: &finishedRes}, "")
	assert.False(t, ok, "a boot whose runner exited is not retried")
	_, ok = retrySkip(&l1Run{results: &finishedRes, hung: true}, "")
	assert.False(t, ok, "a boot past its time limit is not retried")
	skip, ok = retrySkip(&l1Run{results: res}, "")
	assert.True(t, ok, "a boot that reset with no exit record is retried")
	assert.Equal(t, "^(TestBootStockKernel|TestCheckPassthrough|TestConsoleRoundTrip)$", skip)
	_, ok = retrySkip(&l1Run{stalled: true, results: res, earlier: stalled}, "")
	assert.False(t, ok, "only one retry")
}
