package main

import (
	"io"
	"os"

	"golang.org/x/term"

	"github.com/hpcvmm/hpcvmm/termsafe"
)

// consoleOutput is where the guest's console output goes: through
// termsafe's filter when stdout is a terminal, so the guest cannot set the
// user's clipboard or title, make the terminal answer into hpcvmm's stdin,
// or switch its modes (issue 23); stdout itself with --console-raw, or when
// it is a file or a pipe, where the guest's bytes are data and stay raw.
func consoleOutput(stdout io.Writer, raw bool) io.Writer {
	f, ok := stdout.(*os.File)
	if raw || !ok || !term.IsTerminal(int(f.Fd())) {
		return stdout
	}
	return termsafe.NewWriter(stdout)
}
