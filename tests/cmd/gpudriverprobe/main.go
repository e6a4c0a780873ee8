// Command gpudriverprobe prints what package gpudriver selects of the
// running host's NVIDIA driver (the files a job's guest gets with --gpu),
// the device nodes it would make from this host's /proc/devices, and the
// time the selection took: for a real GPU host, to compare with what
// `ldconfig -p` and the NVIDIA container toolkit list there. It changes
// nothing.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/hpcvmm/hpcvmm/gpudriver"
)

func main() {
	t0 := time.Now()
	d, err := gpudriver.Find(gpudriver.Options{})
	took := time.Since(t0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpudriverprobe:", err)
		os.Exit(1)
	}
	fmt.Printf("version %s (selected in %v)\n", d.Version, took)
	for _, l := range d.Libraries {
		fmt.Printf("lib %s %v 64bit=%v\n", l.File, l.Links, l.Is64)
	}
	for _, b := range d.Binaries {
		fmt.Printf("bin %s\n", b)
	}
	pd, err := os.ReadFile("/proc/devices")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpudriverprobe:", err)
		os.Exit(1)
	}
	majors, err := gpudriver.ParseProcDevices(pd)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpudriverprobe:", err)
		os.Exit(1)
	}
	caps, err := gpudriver.Capabilities("/")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpudriverprobe: capabilities:", err)
	}
	nodes, err := gpudriver.Nodes(majors, 1, caps)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpudriverprobe:", err)
		os.Exit(1)
	}
	for _, n := range nodes {
		fmt.Printf("node %s %d:%d %o\n", n.Path, n.Major, n.Minor, n.Mode)
	}
}
