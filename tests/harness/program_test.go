package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
)

func TestProgramRunConfig(t *testing.T) {
	assert.Equal(t, "HPCVMM_PROGRAM='/hpcvmm/program'\nHPCVMM_TIMEOUT='14m0s'\n", programRunConfig(l1Program, 14*time.Minute))
}

func TestProfileBenchReservesBothHugepageSizes(t *testing.T) {
	require.NoError(t, ProfileBench.Validate())
	args, err := ProfileBench.QEMUArgs(L1Boot{Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}, "")
	require.NoError(t, err)
	j := strings.Join(args, " ")
	assert.Contains(t, j, "-smp 2")
	assert.Contains(t, j, "intel_iommu=on hugepagesz=1G hugepages=4 hugepagesz=2M hugepages=512 nohz=off highres=off")
	assert.Contains(t, j, "-device intel-iommu,intremap=on,caching-mode=on,aw-bits=48 -device edu,addr=04.0", "the DMA-map case needs an IOMMU and edu")
	assert.Contains(t, ProfileBench.Setup, "vfio-pci")
	assert.Contains(t, ProfileBench.Setup, "debugfs")
}

func TestFollowFileCopiesLinesAsTheyAppear(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	var out testenv.LockedBuffer
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { followFile(path, &out, stop); close(done) }()
	time.Sleep(100 * time.Millisecond) // the file does not exist yet: no error
	require.NoError(t, os.WriteFile(path, []byte("one\ntw"), 0o644))
	require.Eventually(t, func() bool { return out.String() == "one\n" }, 5*time.Second, 50*time.Millisecond,
		"a complete line is copied, the partial one waits")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, _ = f.WriteString("o\nthree")
	require.NoError(t, f.Close())
	close(stop)
	<-done
	assert.Equal(t, "one\ntwo\nthree\n", out.String(), "the final flush copies the unterminated tail")
}

func TestWatchIdleKillsOnlyWhenSilent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.txt")
	require.NoError(t, os.WriteFile(path, []byte("a"), 0o644))
	killed := make(chan struct{})
	done := make(chan bool, 1)
	go func() { done <- watchIdle(path, 300*time.Millisecond, nil, func() { close(killed) }) }()
	// Growing output keeps it alive.
	for i := 0; i < 5; i++ {
		time.Sleep(100 * time.Millisecond)
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, _ = f.WriteString("b")
		require.NoError(t, f.Close())
	}
	select {
	case <-killed:
		t.Fatal("killed while the file was growing")
	default:
	}
	select {
	case <-killed:
	case <-time.After(5 * time.Second):
		t.Fatal("not killed after the file went silent")
	}
	assert.True(t, <-done)

	stop := make(chan struct{})
	close(stop)
	assert.False(t, watchIdle(path, time.Hour, stop, func() { t.Error("kill after stop") }))
}

func TestLongestSoftLockup(t *testing.T) {
	con := "[  313.18] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [kthreadd:2]\n" +
		"[  345.10] watchdog: BUG: soft lockup - CPU#0 stuck for 49s! [swapper/0:0]\n"
	assert.Equal(t, 49*time.Second, longestSoftLockup([]byte(con)))
	assert.Equal(t, time.Duration(0), longestSoftLockup([]byte("Run /init as init process\n")))
}

func TestWatchSoftLockupKillsAtTheLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	require.NoError(t, os.WriteFile(path, []byte("watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [kthreadd:2]\n"), 0o644))
	killed := make(chan struct{})
	done := make(chan bool, 1)
	stopFollow := make(chan struct{})
	go func() { done <- watchSoftLockup(path, time.Minute, stopFollow, func() { close(killed) }) }()
	time.Sleep(2500 * time.Millisecond)
	select {
	case <-killed:
		t.Fatal("killed at a 22 s lockup with a one-minute limit")
	default:
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	// Written in two pieces: a report split across reads still counts.
	_, _ = f.WriteString("watchdog: BUG: soft lockup - CPU#0 stu")
	require.NoError(t, f.Sync())
	time.Sleep(2500 * time.Millisecond)
	_, _ = f.WriteString("ck for 75s! [swapper/0:0]\n")
	require.NoError(t, f.Close())
	select {
	case <-killed:
	case <-time.After(6 * time.Second):
		t.Fatal("not killed after a 75 s lockup")
	}
	close(stopFollow) // as RunL1Program does once QEMU has exited
	assert.True(t, <-done)

	stop := make(chan struct{})
	close(stop)
	assert.False(t, watchSoftLockup(path, time.Hour, stop, func() { t.Error("kill after stop") }))
}
