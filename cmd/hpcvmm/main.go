// Command hpcvmm runs virtual machines for HPC workloads on KVM: Linux
// guests booted directly, pinned to one NUMA node, on hugepage-backed RAM,
// with GPUs and SR-IOV VFs passed through.
//
//	hpcvmm run --kernel bzImage --initrd initrd.img --cpus 4 --memory 2G
//	hpcvmm check --gpu 0000:82:00.0 --memory 20G
//	hpcvmm devices
//
// It is a thin layer over package vmm: flag parsing, logging, signals and
// the console terminal.
//
// Flags are GNU style (--net, -h/--help) and parsed by github.com/spf13/pflag
// rather than the standard flag package: the project prefers a well-kept
// library where one fits, and pflag is the GNU-style parser most Go tools
// use (cobra, kubectl). The standard package accepts --net but spells it
// -net in its messages, and treats -net and --net alike, where users of
// GNU tools expect -n to be a shorthand. What pflag does not do is left to
// this package: --help lists flags under headings (command.printHelp), and
// a mistake prints one line naming the flag and pointing at --help
// (command.usageError) instead of the whole usage.
//
// Exit status, for every command (exitTable, printed by --help): 0
// success, 1 a failure of the VM, of hpcvmm or of a change to the host, 2
// invalid input, 3 a host that cannot do it (no usable KVM, too few free
// hugepages, a missing /dev/vfio/N...); a job: 125 its VM or agent failed,
// 126/127 COMMAND not executable/found, else COMMAND's own status.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// processStart approximates the process start for the start-to-first-
// KVM_RUN figure: package initialisation runs before main.
var processStart = time.Now()

func main() {
	// The guest agent is this binary too (the job initramfs holds it as
	// /.hpcvmm/hpcvmm-agent and the kernel starts it as init, rdinit=),
	// and so is the 9P file server of -B binds, a child of hpcvmm run
	// (ninep.Spawn) under its own seccomp list: jobrun.Dispatch, as in any
	// program that is its jobs' agent.
	jobrun.Dispatch()
	os.Exit(dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// usage is hpcvmm --help: the commands and the exit statuses.
var usage = `usage: hpcvmm COMMAND [flags]

commands:
  run       boot a guest
  check     check that this host can run the described VM, with fixes
  devices   list the host's passthrough-capable devices
  bind      rebind PCI devices to vfio-pci (journaled)
  unbind    give devices rebound by hpcvmm back to their drivers (also after a crash)
  version   print the version and the revision it was built from

hpcvmm COMMAND --help describes a command's flags.

` + exitHelp("") + "\n"

// dispatch runs the command args name and returns the exit status.
func dispatch(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitInput
	}
	switch args[0] {
	case "run":
		return runRun(args[1:], stdin, stdout, stderr)
	case "check":
		return runCheck(args[1:], stdout, stderr)
	case "devices":
		return runDevices(args[1:], stdout, stderr)
	case "bind":
		return runBind(args[1:], stdout, stderr)
	case "unbind":
		return runUnbind(args[1:], stdout, stderr)
	case "version", "--version":
		return runVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		if len(args) > 1 && args[1] != "help" && !strings.HasPrefix(args[1], "-") {
			return dispatch([]string{args[1], "--help"}, stdin, stdout, stderr) // hpcvmm help run
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "hpcvmm: %s: a command comes first, e.g. hpcvmm run %s (see hpcvmm --help)\n", args[0], args[0])
		return 2
	}
	fmt.Fprintf(stderr, "hpcvmm: unknown command %q: use run, check, devices, bind, unbind or version (see hpcvmm --help)\n", args[0])
	return 2
}

// runVersion implements `hpcvmm version`.
func runVersion(args []string, stdout, stderr io.Writer) int {
	c := newCommand("hpcvmm version",
		"Print hpcvmm's module version, the VCS revision it was built from (with whether the tree had uncommitted changes, and the commit time) and the Go version.",
		"hpcvmm version")
	c.footer = exitHelp("version")
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return rc
	}
	if rc := c.noArgs(stderr, ""); rc >= 0 {
		return rc
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stdout, "hpcvmm: no build information (built without module support)")
		return 0
	}
	fmt.Fprint(stdout, formatVersion(bi))
	return 0
}

// formatVersion renders what the Go toolchain recorded in the binary: the
// module version (a tag, a pseudo-version, or "(devel)" for a plain go
// build in a checkout) and the vcs.* settings go build stamps from the
// checkout, so a report names the exact source.
func formatVersion(bi *debug.BuildInfo) string {
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	var b strings.Builder
	fmt.Fprintf(&b, "hpcvmm %s\n", bi.Main.Version)
	if rev := set["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision %s", rev)
		if set["vcs.modified"] == "true" {
			b.WriteString(" (modified: built with uncommitted changes)")
		}
		if t := set["vcs.time"]; t != "" {
			fmt.Fprintf(&b, ", committed %s", t)
		}
		b.WriteString("\n")
	} else {
		b.WriteString("revision unknown: built without VCS information (-buildvcs=false, in a git worktree: golang/go#58218, or outside a checkout)\n")
	}
	fmt.Fprintf(&b, "built with %s\n", bi.GoVersion)
	return b.String()
}
