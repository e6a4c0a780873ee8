//go:build integration

package tests

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// hostileSequences are terminal controls a guest must not get to the
// user's terminal through hpcvmm's own output: OSC 52 (sets the clipboard),
// OSC 0 (sets the title), CSI 21t (reports the title back as input).
var hostileSequences = []string{"\x1b]52;", "\x1b]0;", "\x1b[21t"}

// TestJobsGuestTextOnATerminal (issue 30, item 1): a real guest writes
// OSC 52, OSC 0 and CSI 21t to its console (the UART hpcvmm prints on its
// stderr) and puts them in the agent's failure reason; with hpcvmm's stderr
// on a pty none of them reaches the terminal, with and without --quiet,
// while the text around them does.
func TestJobsGuestTextOnATerminal(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		ensureDevpts(t)
		root := busyboxRootfs(t)
		onTerminal := func(args ...string) (string, int) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			master, slave, err := pty.Open()
			require.NoError(t, err)
			defer master.Close()
			cmd := exec.CommandContext(ctx, env.HPCVMM(t), jobArgs(t, env, args...)...)
			var stdout testenv.LockedBuffer
			cmd.Stdout, cmd.Stderr = &stdout, slave // stdin: /dev/null, so COMMAND gets no pty
			require.NoError(t, cmd.Start())
			slave.Close()
			var term testenv.LockedBuffer
			copied := make(chan struct{})
			go func() { _, _ = io.Copy(&term, master); close(copied) }()
			err = cmd.Wait()
			if _, ok := err.(*exec.ExitError); err != nil && !ok {
				t.Fatalf("hpcvmm: %v", err)
			}
			select {
			case <-copied:
			case <-time.After(5 * time.Second):
			}
			require.NoError(t, ctx.Err(), "hpcvmm did not end; terminal:\n%q", term.String())
			return term.String(), cmd.ProcessState.ExitCode()
		}
		console := `printf 'before\033]52;c;SGVsbG8=\007\033]0;pwned\007\033[21tafter\n' >/dev/console; exit 3`
		bad := "/x\x1b]52;c;SGVsbG8=\x07\x1b]0;pwned\x07\x1b[21t"
		for _, quiet := range []bool{false, true} {
			var q []string
			if quiet {
				q = []string{"--quiet"}
			}
			out, code := onTerminal(append(q, "--rootfs", root, "--contain", "--", "sh", "-c", console)...)
			assert.Equal(t, 3, code, "quiet=%v; terminal:\n%q", quiet, out)
			if !quiet {
				assert.Contains(t, out, "before", "the guest's console reaches the terminal")
				assert.Contains(t, out, "after")
			}
			for _, seq := range hostileSequences {
				assert.NotContains(t, out, seq, "quiet=%v: the guest's console put %q on the terminal", quiet, seq)
			}

			// The agent's failure reason names the working directory the
			// guest could not enter, escapes and all.
			out, code = onTerminal(append(q, "--rootfs", root, "--contain", "--workdir", bad, "--", "true")...)
			assert.Equal(t, 125, code, "quiet=%v; terminal:\n%q", quiet, out)
			assert.Contains(t, out, "--workdir /x", "the reason is printed")
			for _, seq := range hostileSequences {
				assert.NotContains(t, out, seq, "quiet=%v: the failure reason put %q on the terminal", quiet, seq)
			}
		}
	})
}
