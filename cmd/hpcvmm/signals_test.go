package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeGuest is a VM whose guest powers off (or not) after the button.
type fakeGuest struct {
	pressed  chan struct{}
	powerOff bool // the guest handles the button
	noACPI   bool
}

func (g *fakeGuest) PressPowerButton() error {
	if g.noACPI {
		return errors.New("vmm: the guest has no ACPI power button")
	}
	close(g.pressed)
	return nil
}

func (g *fakeGuest) Shutdown(ctx context.Context) error {
	if err := g.PressPowerButton(); err != nil {
		return err
	}
	if g.powerOff {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// runSignals drives handleStopSignals with the given signals and returns
// the cause it cancelled with (nil when it did not).
func runSignals(t *testing.T, g *fakeGuest, timeout time.Duration, signals ...os.Signal) error {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	built := make(chan powerButton, 1)
	if g != nil {
		built <- g
	}
	done := make(chan struct{})
	go func() {
		handleStopSignals(ctx, sigs, built, timeout, cancel, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	for i, s := range signals {
		if i > 0 && g != nil {
			<-g.pressed // the second signal comes while the guest shuts down
		}
		sigs <- s
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("handleStopSignals did not return")
	}
	return context.Cause(ctx)
}

func TestStopSignals(t *testing.T) {
	t.Run("guest powers off", func(t *testing.T) {
		err := runSignals(t, &fakeGuest{pressed: make(chan struct{}), powerOff: true}, time.Minute, syscall.SIGTERM)
		assert.NoError(t, err, "the VM ends by the guest's power-off, not by cancel")
	})
	t.Run("guest ignores the button", func(t *testing.T) {
		start := time.Now()
		err := runSignals(t, &fakeGuest{pressed: make(chan struct{})}, 200*time.Millisecond, syscall.SIGTERM)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "did not shut down within --shutdown-timeout 200ms")
		assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	})
	t.Run("second signal", func(t *testing.T) {
		err := runSignals(t, &fakeGuest{pressed: make(chan struct{})}, time.Minute, syscall.SIGTERM, syscall.SIGINT)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "received interrupt again")
	})
	t.Run("before the VM exists", func(t *testing.T) {
		err := runSignals(t, nil, time.Minute, syscall.SIGTERM)
		require.Error(t, err)
		assert.Equal(t, "received terminated", err.Error())
	})
	t.Run("no ACPI", func(t *testing.T) {
		err := runSignals(t, &fakeGuest{noACPI: true}, time.Minute, syscall.SIGTERM)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no ACPI power button")
	})
}
