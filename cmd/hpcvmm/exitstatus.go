package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/trustfs"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// The exit statuses hpcvmm itself gives, the same for every command
// (exitTable describes them; a job adds jobproto's 125-127 and COMMAND's
// own).
const (
	exitOK     = 0
	exitFailed = 1 // the VM, hpcvmm or a change to the host failed
	exitInput  = 2 // the request can never work
	// exitHost: this host cannot do it (no usable KVM, too few free
	// hugepages, a missing /dev/vfio/N...). Not 1 or 2, which shells
	// and tools give any failure or misuse, nor 125-127 or 128+N, a
	// job's COMMAND conventions: a Slurm Epilog or health check drains
	// a node on 3 and on nothing else.
	exitHost = 3
)

// exitRow is one status of the table: its code(s), what it means for
// every command (the table of hpcvmm --help), and in each command's own
// words (the table of hpcvmm COMMAND --help); a command absent from per
// never exits with it.
type exitRow struct {
	code    string
	general string
	per     map[string]string
}

// exitTable is the one table of exit statuses: hpcvmm --help and every
// command's --help print it (exitHelp), and so docs/cli.md, generated
// from them. TestExitStatusEveryClass runs each row of each command.
var exitTable = []exitRow{
	{"0", "success", map[string]string{
		"run":     "the guest powered off or rebooted; a job: COMMAND exited 0",
		"check":   "the VM could start (warnings allowed)",
		"devices": "listed",
		"bind":    "done",
		"unbind":  "done, or nothing to restore",
		"version": "printed",
	}},
	{"1", "a failure while doing it: the VM, hpcvmm, or a change to the host (a job's is 125)", map[string]string{
		"run":     "the VM or hpcvmm failed: a triple fault, a KVM or VMM error, a hard stop after a signal (a job: 125)",
		"check":   "the report could not be written",
		"devices": "the list could not be written",
		"bind":    "a device could not be rebound or set (what changed is journaled: hpcvmm unbind gives it back)",
		"unbind":  "a change could not be restored (it stays journaled)",
	}},
	{"2", "invalid input: the request can never work; reported before anything on the host changes", map[string]string{
		"run":     "invalid input (a bad flag or value, a kernel that is not one, sizes that cannot fit), before anything on the host changes",
		"check":   "invalid input (a malformed BDF, sizes that cannot fit this host)",
		"devices": "invalid input",
		"bind":    "invalid input (a malformed BDF or option, an unknown --owner, a job without the GRES)",
		"unbind":  "invalid input",
		"version": "invalid input",
	}},
	{"3", "this host cannot do it: no usable KVM, too few free hugepages, a missing /dev/vfio/N, a device the host uses...: the node is at fault, found before anything on the host changes", map[string]string{
		"run":     "this host cannot run the VM (the failed checks of hpcvmm check, with their fixes: no usable /dev/kvm, too few free hugepages, a missing /dev/vfio/N...), before anything on the host changes; a job: before IMAGE is read",
		"check":   "a check failed: this host cannot run the VM (each failure with its fix)",
		"devices": "the host's PCI devices could not be read",
		"bind":    "this node cannot: a device the host uses (without --force), a gres.conf or /dev/vfio/N that does not match the node",
		"unbind":  "the state directory or a journal is one others could have written: refused before anything changed",
	}},
	{fmt.Sprint(jobproto.CodeAgentFailed), "a job's VM or agent failed (hpcvmm run -- COMMAND), with the reason", map[string]string{
		"run": "a job: the VM or the agent failed (a kernel panic, a triple fault, an agent error), with the reason",
	}},
	{fmt.Sprintf("%d, %d", jobproto.CodeNotExecutable, jobproto.CodeNotFound), "a job's COMMAND is not executable, not found", map[string]string{
		"run": "a job: COMMAND (or a dynamic COMMAND's ELF interpreter) not executable, not found (in IMAGE, before boot; in the guest for a SquashFS, EROFS or SIF IMAGE)",
	}},
	{"other", "a job's COMMAND's own status (128+N: killed by signal N)", map[string]string{
		"run": "a job: COMMAND's own status, 128+N when signal N killed it",
	}},
}

// exitWhy is the table's closing note: why 3, and where a job's COMMAND
// may give the same numbers.
const exitWhy = "3 is hpcvmm's own: shells and tools give 1 and 2 to any failure and misuse, and 125-127 " +
	"and 128+N are a job's COMMAND conventions (docker run, env, shells), so a Slurm Epilog or a health check " +
	"can drain a node on 3 alone. A job's COMMAND may exit 1, 2 or 3 itself: hpcvmm's own 2 and 3 come " +
	"before the VM starts, with a one-line reason on stderr."

// exitHelp renders exitTable for command cmd ("" for every command).
func exitHelp(cmd string) string {
	var b strings.Builder
	if cmd == "" {
		b.WriteString("Exit status, for every command (hpcvmm COMMAND --help says what each means there):\n")
	} else {
		b.WriteString("Exit status:\n")
	}
	const col = 12
	for _, r := range exitTable {
		text := r.general
		if cmd != "" {
			var ok bool
			if text, ok = r.per[cmd]; !ok {
				continue
			}
		}
		fmt.Fprintf(&b, "  %-*s%s\n", col-2, r.code, wrapText(text, col, helpWidth))
	}
	if cmd == "" || cmd == "run" {
		b.WriteString("\n" + wrapText(exitWhy, 0, helpWidth) + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// jobExit is the exit status of each kind of a job's failure to run
// (jobrun.Error).
var jobExit = map[jobrun.Kind]int{
	jobrun.Input:         exitInput,
	jobrun.Host:          exitHost,
	jobrun.VMFailed:      jobproto.CodeAgentFailed,
	jobrun.NotFound:      jobproto.CodeNotFound,
	jobrun.NotExecutable: jobproto.CodeNotExecutable,
}

// exitCode is the exit status of a failed command: a job's by its kind
// (a jobrun.Error: jobExit); 3 when the host is at fault (a
// vmm.PreflightError, a node set up for Slurm otherwise than its gres.conf
// says, a file others could have written in hpcvmm's trusted state), 2 for
// invalid input (a vmm.FieldError), else failed, the command's own failure
// (1, or 125 for a job).
func exitCode(err error, failed int) int {
	var je *jobrun.Error
	if errors.As(err, &je) {
		if code, ok := jobExit[je.Kind]; ok {
			return code
		}
		return jobproto.CodeAgentFailed
	}
	var pe *vmm.PreflightError
	var te *trustfs.Error
	switch {
	case errors.As(err, &pe), errors.Is(err, slurm.ErrNodeSetup), errors.As(err, &te):
		return exitHost
	}
	var fe *vmm.FieldError
	if errors.As(err, &fe) {
		return exitInput
	}
	return failed
}
