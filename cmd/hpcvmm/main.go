// Command hpcvmm runs virtual machines for HPC workloads on KVM: Linux
// guests booted directly, pinned to one NUMA node, on hugepage-backed RAM,
// with GPUs and SR-IOV VFs passed through.
//
//	hpcvmm run --kernel bzImage --initrd initrd.img --cpus 4 --memory 2G
//	hpcvmm check --gpu 0000:82:00.0 --memory 20G
//	hpcvmm devices
//
// It is a thin layer over package vmm: flag parsing, logging and signals.
package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// processStart approximates the process start for the start-to-first-
// KVM_RUN figure: package initialisation runs before main.
var processStart = time.Now()

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: hpcvmm <command> [flags]

commands:
  run       boot a guest (hpcvmm run --help for the flags)
  check     check that this host can run the described VM, with fixes
  devices   list the host's passthrough-capable devices
  bind      rebind PCI devices to vfio-pci (journaled)
  unbind    give devices rebound by hpcvmm back to their drivers (also after a crash)
  version   print the version
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func dispatch(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
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
		fmt.Fprintln(stdout, "hpcvmm", version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "hpcvmm: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
