package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostile is what a guest writes on its UART or hvc0 (or puts in the
// agent's Failed.Reason or a Log line): OSC 52 sets the user's clipboard,
// OSC 0 the window title, CSI 21t makes the terminal type its title into
// hpcvmm's stdin.
const hostile = "\x1b]52;c;cm0gLXJmIH4K\a\x1b]0;pwned\a\x1b[21t"

// dangerous are the sequences that must not reach the terminal.
var dangerous = []string{"\x1b]52", "\x1b]0;", "\x1b[21t", "\a"}

// ptyStderr is a terminal as hpcvmm's stderr: what hpcvmm writes to tty
// comes out of the returned function.
func ptyStderr(t *testing.T) (tty *os.File, output func() string) {
	ptmx, tty, err := pty.Open()
	require.NoError(t, err)
	t.Cleanup(func() { ptmx.Close(); tty.Close() })
	return tty, func() string {
		tty.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		_ = ptmx.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			n, err := ptmx.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "input/output error") {
					t.Errorf("reading the pty: %v", err)
				}
				return b.String()
			}
		}
	}
}

// TestJobGuestTextOnATerminal is issue 30's defect 1: in job mode the
// guest's console (through consoleWatch), the agent's Log lines (through
// the log) and the one-line reason (Failed.Reason, or the last
// hpcvmm-agent: line) reached a terminal stderr raw, with and without
// --quiet. A real guest cannot boot on this host (kvm_pvm), so the guest's
// bytes are written through the same writers runJob gives jobrun, to a pty.
func TestJobGuestTextOnATerminal(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		tty, output := ptyStderr(t)
		logOut, consoleOut := jobStderr(tty, quiet)
		log := slog.New(slog.NewTextHandler(logOut, nil))
		// The kernel's and agent's console, as the UART writes it (a byte
		// at a time) and as hvc0 does (chunks): jobrun passes it on to
		// Request.Console unchanged.
		for _, b := range []byte("[    1.0] boot " + hostile + "ok\n") {
			_, _ = consoleOut.Write([]byte{b})
		}
		agentLine := "hpcvmm-agent: cannot start " + hostile + "sh"
		_, _ = consoleOut.Write([]byte(agentLine + "\n"))
		log.Info("guest agent: " + hostile)
		// jobrun's reason for a guest that ended without a status: the
		// console's last hpcvmm-agent: line, as the guest wrote it.
		printJobReason(tty, "the guest ended without the command's status: "+agentLine)
		printJobReason(tty, "agent: "+hostile+"exec failed")
		out := output()
		for _, d := range dangerous {
			assert.NotContains(t, out, d, "quiet=%v: %q reached the terminal: %q", quiet, d, out)
		}
		assert.Contains(t, out, "hpcvmm run: the guest ended without the command's status: hpcvmm-agent: cannot start sh", "quiet=%v", quiet)
		assert.Contains(t, out, "hpcvmm run: agent: exec failed", "quiet=%v", quiet)
		if !quiet {
			assert.Contains(t, out, "[    1.0] boot ok", "the console's text passes")
		} else {
			assert.NotContains(t, out, "boot", "--quiet prints no console")
		}
	}
}

// TestJobGuestTextToAPipe: a file or a pipe gets the guest's bytes as they
// are (they are data there, and a test or log reader sees what the guest
// sent).
func TestJobGuestTextToAPipe(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	logOut, consoleOut := jobStderr(w, false)
	assert.Equal(t, io.Writer(w), logOut)
	assert.Equal(t, io.Writer(w), consoleOut)
	printJobReason(w, hostile)
	w.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, "hpcvmm run: "+hostile+"\n", string(b))
}
