//go:build integration

package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"hash"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// hashSink is a port's ToHost: it hashes what the guest sends and notes
// whether its Close came before vm.Close (the guest closed the port) or
// from vm.Close (the console closing its ports' outputs).
type hashSink struct {
	mu        sync.Mutex
	h         hash.Hash
	n         int
	closed    bool
	done      chan struct{}
	vmClosing *atomic.Bool
	byVMClose bool
}

func (s *hashSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n += len(p)
	return s.h.Write(p)
}

func (s *hashSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.byVMClose = s.vmClosing.Load()
	close(s.done)
	return nil
}

// TestConsoleNamedPorts boots the stock L2 kernel with two named
// virtio-console ports through the vmm API (vmm.Config.ConsolePorts): the
// guest's /init finds them by /sys/class/virtio-ports/*/name and runs
// `cat IN > OUT`. 16 MiB of random bytes given to port "in" come back on
// port "out" with the same SHA-256; the end of the host's stream ends the
// guest's cat (end of file host to guest), and the guest closing OUT closes
// the host's writer while the VM still runs (end of file guest to host).
func TestConsoleNamedPorts(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		data := make([]byte, 16<<20)
		_, err := rand.Read(data)
		require.NoError(t, err)
		want := sha256.Sum256(data)
		var vmClosing atomic.Bool
		out := &hashSink{h: sha256.New(), vmClosing: &vmClosing, done: make(chan struct{})}
		stdout := &testenv.LockedBuffer{}

		cfg := vmm.DefaultConfig()
		cfg.Kernel, cfg.Initrd = env.L2Kernel(t), env.L2Initrd(t)
		cfg.Cmdline = "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=ports"
		cfg.CPUs, cfg.Memory, cfg.HugePages = 1, 512<<20, guestmem.Page4K
		cfg.Console = vmm.ConsoleVirtio
		cfg.Stdout = stdout
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.ConsolePorts = []console.Port{
			{Name: "org.hpcvmm.test.in", FromHost: bytes.NewReader(data)},
			{Name: "org.hpcvmm.test.out", ToHost: out},
		}
		vm, err := vmm.New(cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		start := time.Now()
		runErr := vm.Run(ctx)
		elapsed := time.Since(start)
		// The guest reboots right after its cat closed OUT, while up to
		// its transmit ring's worth of output may still wait for the
		// host: the device goroutine keeps running until vm.Close, so
		// give it the time to drain and end the stream.
		select {
		case <-out.done:
		case <-time.After(2 * time.Minute):
		}
		vmClosing.Store(true)
		require.NoError(t, vm.Close())
		require.NoError(t, runErr, "console tail:\n%s", harness.Tail(stdout.String(), 30))

		g, bad := harness.ParseGuestResults(stdout.String())
		assert.Empty(t, bad, "malformed guest result lines")
		require.Empty(t, g["error"], "guest error; console tail:\n%s", harness.Tail(stdout.String(), 30))
		assert.Equal(t, "0", g["ports_cat_rc"], "guest cat's exit status (it ends only at end of file on IN)")
		out.mu.Lock()
		defer out.mu.Unlock()
		assert.Equal(t, len(data), out.n, "bytes back on port out")
		var got [32]byte
		copy(got[:], out.h.Sum(nil))
		assert.Equal(t, want, got, "SHA-256 of the bytes back on port out")
		assert.True(t, out.closed, "port out's writer never closed")
		assert.False(t, out.byVMClose, "port out's writer closed only by vm.Close, not by the guest closing the port")
		env.Record(t, "ports_guest_seconds", g["ports_seconds"])
		env.Record(t, "ports_vm_seconds", strconv.FormatFloat(elapsed.Seconds(), 'f', 2, 64))
	})
}
