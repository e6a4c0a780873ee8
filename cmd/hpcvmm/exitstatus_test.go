package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/jobproto"
)

// failingWriter fails every write: a report or list that cannot be written.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// noKVMTree is a host with CPUs and memory but no /dev/kvm: it cannot run
// any VM.
func noKVMTree(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 8<<30)
	tr.CPUInfo(46)
	tr.Interrupts(true)
	return tr
}

// TestExitStatusEveryClass runs each status of exitTable for each command
// that gives it, on paths a host without KVM reaches: the status says who
// failed. (A booted guest's 0, a job's own status and a run's hard stop
// need a guest that boots: tests/boot_test.go and tests/jobs_test.go.)
func TestExitStatusEveryClass(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	kernel := synthKernel(t)
	noKVM := noKVMTree(t)
	hostFlags := func(tr *hosttest.Tree) []string { return []string{"--sysfs", tr.Sys(), "--procfs", tr.Proc()} }
	// A host tree with hardware KVM whose /dev/kvm is a plain file: every
	// check passes and opening KVM fails, the VM's own failure.
	brokenKVM := noKVMTree(t)
	brokenKVM.KVM()
	brokenKVM.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/data"), []byte("x"), 0o644))
	vm := func(tr *hosttest.Tree, extra ...string) []string {
		return append(append([]string{"run", "--kernel", kernel, "--memory", "256M", "--hugepages", "none", "--console", "none"}, hostFlags(tr)...), extra...)
	}
	job := func(tr *hosttest.Tree, extra ...string) []string {
		a := append(append([]string{"run", "--kernel", kernel, "--memory", "256M", "--hugepages", "none", "--contain"}, hostFlags(tr)...), "--rootfs", img)
		return append(a, extra...)
	}

	// The other commands' hosts: a device on vfio-pci (bind succeeds), one
	// the host uses (bind refuses it), one missing from sysfs (the rebind
	// fails).
	ready := readyTree(t)
	ready.Write("sys/bus/pci/devices/0000:00:04.0/driver_override", "vfio-pci\n")
	const nic = "0000:00:03.0"
	ready.AddDevice(hosttest.Device{BDF: nic, Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3})
	ready.ClassNet(nic, "virtio2/net", "eth0", 0x1003)
	ready.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
	bind := func(args ...string) []string {
		return append(append([]string{"bind", "--state-dir", filepath.Join(t.TempDir(), "state"), "--devfs", ready.Dev()}, hostFlags(ready)...), args...)
	}
	looseState := t.TempDir()
	require.NoError(t, os.Chmod(looseState, 0o777))
	badJournal := t.TempDir()
	// A journal of a process that no longer runs, with a change this
	// hpcvmm cannot undo.
	require.NoError(t, os.WriteFile(filepath.Join(badJournal, "4194303-00.json"),
		[]byte(`{"pid":4194303,"changes":[{"kind":"from-a-newer-hpcvmm","bdf":"0000:00:04.0"}]}`), 0o600))

	for _, tc := range []struct {
		cmd  string // the exitTable column
		code int
		args []string
		out  func(*bytes.Buffer) // nil: a buffer; else stdout is a failing writer
		want string              // in stderr (or stdout for a success)
	}{
		{"run", exitFailed, vm(brokenKVM), nil, "hpcvmm run:"},
		{"run", exitInput, vm(noKVM, "--memory", "lots"), nil, "--memory"},
		{"run", exitHost, vm(noKVM), nil, "the host cannot run this VM"},
		{"job", exitInput, job(noKVM, "--user", "alice", "--", "sh"), nil, "--user alice"},
		{"job", jobproto.CodeNotFound, job(brokenKVM, "--", "nosuch"), nil, "not found"},
		{"job", jobproto.CodeNotExecutable, job(brokenKVM, "--", "/bin/data"), nil, "not executable"},
		{"check", exitOK, append([]string{"check", "--gpu", "00:04.0"}, hostFlags(readyTree(t))...), nil, "0 failed"},
		{"check", exitFailed, append([]string{"check", "--gpu", "00:04.0"}, hostFlags(readyTree(t))...), func(*bytes.Buffer) {}, "write report"},
		{"check", exitInput, append([]string{"check", "--gpu", "zz"}, hostFlags(noKVM)...), nil, `--gpu: PCI address "zz"`},
		{"check", exitHost, append([]string{"check", "--memory", "256M", "--hugepages", "none"}, hostFlags(noKVM)...), nil, ""},
		{"devices", exitOK, append([]string{"devices"}, hostFlags(readyTree(t))...), nil, "0000:00:04.0"},
		{"devices", exitFailed, append([]string{"devices", "--json"}, hostFlags(readyTree(t))...), func(*bytes.Buffer) {}, "disk full"},
		{"devices", exitInput, []string{"devices", "extra"}, nil, "unexpected argument"},
		{"devices", exitHost, []string{"devices", "--sysfs", filepath.Join(t.TempDir(), "absent")}, nil, "hpcvmm devices:"},
		{"bind", exitOK, bind("0000:00:04.0"), nil, ""},
		{"bind", exitFailed, bind("0000:00:09.0"), nil, "hpcvmm bind:"},
		{"bind", exitInput, bind("0000:zz:00.0"), nil, `"0000:zz:00.0"`},
		{"bind", exitHost, bind(nic), nil, "the host uses it"},
		{"unbind", exitOK, []string{"unbind", "--state-dir", t.TempDir()}, nil, "nothing to restore"},
		{"unbind", exitFailed, []string{"unbind", "--state-dir", badJournal}, nil, "hpcvmm unbind:"},
		{"unbind", exitInput, []string{"unbind", "not-a-bdf"}, nil, `"not-a-bdf"`},
		{"unbind", exitHost, []string{"unbind", "--state-dir", looseState}, nil, "chmod go-w"},
		{"version", exitOK, []string{"version"}, nil, "hpcvmm "},
		{"version", exitInput, []string{"version", "--bogus"}, nil, "unknown flag"},
	} {
		var out, errb bytes.Buffer
		var stdout interface{ Write([]byte) (int, error) } = &out
		if tc.out != nil {
			stdout = failingWriter{}
		}
		rc := dispatch(tc.args, strings.NewReader(""), stdout, &errb)
		assert.Equal(t, tc.code, rc, "%s %q: stdout %s stderr %s", tc.cmd, tc.args, out.String(), errb.String())
		assert.Contains(t, out.String()+errb.String(), tc.want, "%s %q", tc.cmd, tc.args)
		// The status is one the command's --help lists.
		col := tc.cmd
		if col == "job" {
			col = "run"
		}
		_, help, _ := hpcvmm(col, "--help")
		assert.Regexp(t, fmt.Sprintf(`(?m)^  (%d|\d+, %d|%d, \d+) `, tc.code, tc.code, tc.code), help[strings.Index(help, "\nExit status"):], "%s --help lists %d", col, tc.code)
	}
}

// TestExitHelpIsOneTable: every command's table is exitTable's rows that
// command gives, in order, and hpcvmm --help has them all.
func TestExitHelpIsOneTable(t *testing.T) {
	_, top, _ := hpcvmm("--help")
	for _, r := range exitTable {
		assert.Contains(t, top, "\n  "+r.code+" ", "hpcvmm --help lists %s", r.code)
	}
	for _, cmd := range []string{"run", "check", "devices", "bind", "unbind", "version"} {
		_, help, _ := hpcvmm(cmd, "--help")
		assert.True(t, strings.HasSuffix(help, exitHelp(cmd)+"\n"), "%s --help ends with its exit statuses", cmd)
		for _, r := range exitTable {
			_, gives := r.per[cmd]
			assert.Equal(t, gives, strings.Contains(help, "\n  "+r.code+" "), "%s --help and exit status %s", cmd, r.code)
		}
	}
}
