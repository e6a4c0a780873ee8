package testenv

import (
	"runtime"
	"testing"
)

// recorder is a testing.TB that records a skip or a failure and, as the
// real ones do, stops the goroutine that called it.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped, r.msg = true, args[0].(string)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	runtime.Goexit()
}

// outcome runs SkipOrFail on its own goroutine, as a test body would.
func outcome(t *testing.T) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		SkipOrFail(r, "no %s", "kvm")
	}()
	<-done
	return r
}

func TestSkipOrFail(t *testing.T) {
	t.Setenv(RequireIntegrationEnv, "")
	if r := outcome(t); !r.skipped || r.failed || r.msg != "no kvm" {
		t.Fatalf("without %s: skipped=%v failed=%v msg=%q, want a skip", RequireIntegrationEnv, r.skipped, r.failed, r.msg)
	}
	t.Setenv(RequireIntegrationEnv, "1")
	if r := outcome(t); r.skipped || !r.failed {
		t.Fatalf("with %s=1: skipped=%v failed=%v, want a failure", RequireIntegrationEnv, r.skipped, r.failed)
	}
}
