package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestConsoleOutputOnTerminal is issue 23's defect 9b: the guest's console
// bytes reached the user's terminal raw, an OSC 52 setting its clipboard
// among them. On a terminal they now go through termsafe; --console-raw
// and a pipe keep them raw.
func TestConsoleOutputOnTerminal(t *testing.T) {
	const in = "ok\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b[6n\x1b[1;32m done\x1b[0m"
	ptm, pts := openPTY(t)
	tio, err := unix.IoctlGetTermios(int(pts.Fd()), unix.TCGETS)
	require.NoError(t, err)
	tio.Oflag &^= unix.OPOST // bytes as written
	require.NoError(t, unix.IoctlSetTermios(int(pts.Fd()), unix.TCSETS, tio))
	read := func(n int) string {
		buf := make([]byte, n)
		got := 0
		for got < n {
			m, err := ptm.Read(buf[got:])
			require.NoError(t, err)
			got += m
		}
		return string(buf)
	}

	out := consoleOutput(pts, false)
	_, err = out.Write([]byte(in))
	require.NoError(t, err)
	want := "ok\x1b[1;32m done\x1b[0m"
	assert.Equal(t, want, read(len(want)))

	raw := consoleOutput(pts, true)
	assert.Same(t, pts, raw, "--console-raw")
	_, err = raw.Write([]byte(in))
	require.NoError(t, err)
	assert.Equal(t, in, read(len(in)))

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.Same(t, w, consoleOutput(w, false), "a pipe gets the guest's bytes")
}
