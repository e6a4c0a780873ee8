package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// hpcvmm runs the CLI's entry function in-process, as main does.
func hpcvmm(args ...string) (rc int, stdout, stderr string) {
	var out, errb bytes.Buffer
	rc = dispatch(args, strings.NewReader(""), &out, &errb)
	return rc, out.String(), errb.String()
}

// synthKernel writes a minimal bzImage (boot protocol 2.15, 64-bit entry,
// relocatable) that boot.ParseBzImage accepts, so `hpcvmm run` gets past
// the kernel to the checks behind it without a real kernel on the host.
// Offsets are literals from the kernel's bootparam.h.
func synthKernel(t *testing.T) string {
	img := boottest.BzImage(nil, 0, 0)
	p := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(p, img, 0o644))
	return p
}

// TestExitStatusInvalidInput: every kind of invalid input reachable
// without KVM exits 2 with one line on stderr that names the flag (or
// argument) and nothing on stdout.
func TestExitStatusInvalidInput(t *testing.T) {
	kernel := synthKernel(t)
	notKernel := filepath.Join(t.TempDir(), "not-a-kernel")
	require.NoError(t, os.WriteFile(notKernel, make([]byte, 64<<10), 0o644))
	openCache := filepath.Join(t.TempDir(), "kernels")
	require.NoError(t, os.Mkdir(openCache, 0o755))
	require.NoError(t, os.Chmod(openCache, 0o777))
	for _, tc := range []struct {
		args []string
		want []string
	}{
		// Flag values the parser rejects: one line, with a pointer to --help.
		{[]string{"run", "--net", "tap=x,queues=0"}, []string{"hpcvmm run: --net", "queues=0", "(see hpcvmm run --help)"}},
		{[]string{"run", "--net", "tap=x,speed=10"}, []string{"--net", `unknown key "speed"`, "--help"}},
		{[]string{"run", "--memory", "lots"}, []string{"--memory", `"lots"`, "--help"}},
		{[]string{"run", "--memory=12Q"}, []string{"--memory", `"12Q"`, "--help"}},
		{[]string{"run", "--hugepages", "3M"}, []string{"--hugepages", `"3M"`, "1G, 2M or none", "--help"}},
		{[]string{"run", "--cpus", "x"}, []string{"--cpus", `"x"`, "--help"}},
		{[]string{"run", "--numa-node", "first"}, []string{"--numa-node", "node number or auto", "--help"}},
		{[]string{"run", "--cpu-list", "7-4"}, []string{"--cpu-list", "7-4", "--help"}},
		{[]string{"run", "--console", "tty"}, []string{"--console", "virtio, serial or none", "--help"}},
		{[]string{"run", "--log-level", "loud"}, []string{"--log-level", "debug, info, warn or error", "--help"}},
		{[]string{"run", "--p2p=maybe"}, []string{"--p2p", "true or false", "--help"}},
		{[]string{"run", "--kernel-decompress", "gust"}, []string{"--kernel-decompress", "want host or guest", "--help"}},
		{[]string{"run", "--kernel-cache-size", "0"}, []string{"--kernel-cache-size", "above zero", "--help"}},
		// Unknown flags, single-dash long flags, missing values, stray arguments.
		{[]string{"run", "--bogus"}, []string{"unknown flag --bogus", "--help"}},
		{[]string{"run", "-net", "tap=x"}, []string{"unknown flag -net", "two dashes, --net", "--help"}},
		{[]string{"run", "-kernel=/boot/vmlinuz"}, []string{"unknown flag -kernel", "--kernel"}},
		{[]string{"run", "--kernel"}, []string{"--kernel needs a value"}},
		{[]string{"run", "/boot/vmlinuz"}, []string{`unexpected argument "/boot/vmlinuz"`, "--kernel"}},
		{[]string{"run", "--kernel", kernel, "--p2p", "false"}, []string{`unexpected argument "false"`, "--p2p=false"}},
		// Values only vmm.Config.Validate and the boot protocol can judge.
		{[]string{"run"}, []string{"--kernel", "no kernel given"}},
		{[]string{"run", "--kernel", "/nonexistent/vmlinuz"}, []string{"--kernel", "/nonexistent/vmlinuz does not exist"}},
		{[]string{"run", "--kernel", notKernel}, []string{"--kernel", "not a bzImage"}},
		{[]string{"run", "--kernel", kernel, "--initrd", "/nonexistent/initrd"}, []string{"--initrd", "does not exist"}},
		{[]string{"run", "--kernel", kernel, "--cpus", "0"}, []string{"--cpus", "at least 1"}},
		{[]string{"run", "--kernel", kernel, "--memory", "1536M", "--hugepages", "1G"}, []string{"--memory", "not a multiple of the 1G page size"}},
		{[]string{"run", "--kernel", kernel, "--memory", "16M", "--hugepages", "none"}, []string{"--memory", "too small"}},
		{[]string{"run", "--kernel", kernel, "--net", "tap=x,mac=zz"}, []string{"--net"}},
		{[]string{"run", "--kernel", kernel, "--kernel-cache", openCache}, []string{"--kernel-cache", "writable by group or others", "chmod go-w"}},
		{[]string{"run", "--kernel", kernel, "--kernel-cache", "relative/dir"}, []string{"--kernel-cache", "not an absolute path"}},
		// The other commands.
		{[]string{"check", "--memory", "lots"}, []string{"hpcvmm check: --memory", "--help"}},
		{[]string{"check", "--cpus", "0"}, []string{"--cpus 0", "--help"}},
		{[]string{"check", "0000:00:04.0"}, []string{"unexpected argument", "--gpu"}},
		{[]string{"check", "-gpu", "00:04.0"}, []string{"unknown flag -gpu", "--gpu"}},
		{[]string{"devices", "--bogus"}, []string{"hpcvmm devices: unknown flag --bogus", "--help"}},
		{[]string{"devices", "extra"}, []string{"unexpected argument"}},
		{[]string{"bind"}, []string{"hpcvmm bind: no device given"}},
		{[]string{"bind", "0000:zz:00.0"}, []string{"hpcvmm bind:", `"0000:zz:00.0"`}},
		{[]string{"unbind", "--state-dir"}, []string{"--state-dir needs a value"}},
		{[]string{"unbind", "not-a-bdf"}, []string{"hpcvmm unbind:", `"not-a-bdf"`}},
		{[]string{"version", "--bogus"}, []string{"hpcvmm version: unknown flag --bogus"}},
		// The command itself.
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`, "--help"}},
		{[]string{"--net", "tap=x"}, []string{"a command comes first", "hpcvmm run --net"}},
	} {
		rc, out, errs := hpcvmm(tc.args...)
		assert.Equal(t, 2, rc, "%q: exit status; stderr: %s", tc.args, errs)
		assert.Empty(t, out, "%q: nothing on stdout", tc.args)
		assert.Equal(t, 1, strings.Count(errs, "\n"), "%q: one line on stderr, not a usage dump: %s", tc.args, errs)
		for _, w := range tc.want {
			assert.Contains(t, errs, w, tc.args)
		}
	}

	rc, _, errs := hpcvmm()
	assert.Equal(t, 2, rc, "no command")
	assert.Contains(t, errs, "usage: hpcvmm COMMAND")
}

// TestExitStatusHostCannotRun: a host that cannot run the VM (here: no
// /dev/kvm) is the host's fault, exit 3, as `hpcvmm check` reports the
// same failure: not invalid input, since no flag value would fix it.
func TestExitStatusHostCannotRun(t *testing.T) {
	tr := hosttest.New(t) // no dev/kvm
	tr.Node(0, "0-3", 8<<30)
	tr.CPUInfo(46)
	tr.Interrupts(true)
	kernel := synthKernel(t)
	rc, out, errs := hpcvmm("run", "--kernel", kernel, "--memory", "256M", "--hugepages", "none", "--console", "none",
		"--sysfs", tr.Sys(), "--procfs", tr.Proc())
	assert.Equal(t, exitHost, rc, errs)
	assert.Empty(t, out)
	assert.Contains(t, errs, "hpcvmm run: the host cannot run this VM")
	assert.Contains(t, errs, filepath.Join(tr.Root, "dev/kvm")+" does not exist: KVM is not available")
	assert.Contains(t, errs, "fix: modprobe")

	rc, _, _ = hpcvmm("check", "--memory", "256M", "--hugepages", "none", "--sysfs", tr.Sys(), "--procfs", tr.Proc())
	assert.Equal(t, exitHost, rc, "hpcvmm check agrees")
}

// singleDashLong matches a long flag spelled with one dash, as the standard flag
// package prints them ("-net"), at a word start.
var singleDashLong = regexp.MustCompile(`(^|[\s\[(,])-[a-z][a-z-]+`)

func TestHelp(t *testing.T) {
	for _, cmd := range []string{"run", "check", "devices", "bind", "unbind", "version"} {
		for _, h := range []string{"--help", "-h"} {
			rc, out, errs := hpcvmm(cmd, h)
			assert.Equal(t, 0, rc, cmd)
			assert.Empty(t, errs, cmd)
			assert.True(t, strings.HasPrefix(out, "usage: hpcvmm "+cmd), "%s %s:\n%s", cmd, h, out)
			assert.Contains(t, out, "-h, --help")
			assert.Empty(t, singleDashLong.FindAllString(out, -1), "%s: GNU-style flags only:\n%s", cmd, out)
			assert.NotContains(t, out, "--sysfs", "test-only flags stay hidden")
			for _, line := range strings.Split(out, "\n") {
				assert.LessOrEqual(t, len(line), 100, "%s: help line too wide: %q", cmd, line)
			}
		}
	}
	// Help wins over a mistake before it, and `hpcvmm help run` is `hpcvmm run --help`.
	rc, out, _ := hpcvmm("run", "--bogus", "--help")
	assert.Equal(t, 0, rc)
	_, want, _ := hpcvmm("run", "--help")
	assert.Equal(t, want, out)
	rc, out, _ = hpcvmm("help", "run")
	assert.Equal(t, 0, rc)
	assert.Equal(t, want, out)

	for _, h := range []string{"--help", "-h", "help"} {
		rc, out, errs := hpcvmm(h)
		assert.Equal(t, 0, rc)
		assert.Empty(t, errs)
		assert.Contains(t, out, "usage: hpcvmm COMMAND")
		assert.Empty(t, singleDashLong.FindAllString(out, -1), out)
	}
}

// TestRunHelpGroups: `hpcvmm run --help` lists every flag once, under the
// heading a user looks for it in, headings in order, and ends with the
// exit-status table.
func TestRunHelpGroups(t *testing.T) {
	_, out, _ := hpcvmm("run", "--help")
	groups := map[string][]string{
		"Guest":               {"kernel", "kernel-decompress", "kernel-cache", "kernel-cache-size", "initrd", "cmdline", "cpus", "memory", "hugepages", "acpi"},
		"Placement":           {"numa-node", "cpu-list", "allow-cross-numa", "cpu-mode", "prefault-workers", "topology"},
		"Devices":             {"gpu", "vf", "bind-devices", "p2p", "net", "nccl-topo"},
		"Console and logging": {"console", "log-level", "shutdown-timeout", "seccomp"},
		"Job":                 {"rootfs", "env", "env-file", "workdir", "user", "quiet", "dns", "hostname", "module", "gpu-libs", "rootfs-mode", "bind", "no-home", "no-cwd", "contain"},
		"Other":               {"help"},
	}
	order := []string{"Guest", "Placement", "Devices", "Console and logging", "Job", "Other"}
	section := map[string]string{} // flag -> heading it is listed under
	heading := ""
	var seen []string
	for _, line := range strings.Split(out, "\n") {
		if h, ok := strings.CutSuffix(line, ":"); ok && !strings.HasPrefix(line, " ") && groups[h] != nil {
			heading = h
			seen = append(seen, h)
			continue
		}
		if m := regexp.MustCompile(`^  (?:-[a-zA-Z], )?--([a-z0-9-]+)`).FindStringSubmatch(line); m != nil {
			_, dup := section[m[1]]
			assert.False(t, dup, "--%s listed twice", m[1])
			section[m[1]] = heading
		}
	}
	assert.Equal(t, order, seen, "headings in order")
	n := 0
	for g, flags := range groups {
		for _, f := range flags {
			assert.Equal(t, g, section[f], "--%s", f)
			n++
		}
	}
	c, _ := newRunCommand()
	visible := 0
	c.fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			visible++
			assert.Contains(t, section, f.Name, "--%s is parsed but not in --help", f.Name)
		}
	})
	assert.Equal(t, n, visible)
	assert.Contains(t, out, "Ctrl-A x stops the VM")
	assert.True(t, strings.HasSuffix(out, exitHelp("run")+"\n"), "run --help ends with its exit statuses")
}

// TestREADMEMatchesRunFlags: the `hpcvmm run` flag table of
// docs/running.md (moved there from README) lists exactly the flags --help
// lists, and its exit-status line says what --help says.
func TestREADMEMatchesRunFlags(t *testing.T) {
	readme, err := os.ReadFile("../../docs/running.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "## `hpcvmm run`")
	require.GreaterOrEqual(t, start, 0, "docs/running.md has a `hpcvmm run` section")
	section := text[start:]
	section = section[:strings.Index(section[3:], "\n## ")+3]
	var inTable []string
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllStringSubmatch(section, -1) {
		inTable = append(inTable, m[1])
	}
	c, _ := newRunCommand()
	var flags, jobFlags []string
	c.fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden || fl.Name == "help" {
			return
		}
		if isJobFlag(c, fl.Name) {
			jobFlags = append(jobFlags, fl.Name)
			return
		}
		flags = append(flags, fl.Name)
	})
	// The job flags are described in docs/jobs.md, which README and
	// docs/running.md point to.
	jobs, err := os.ReadFile("../../docs/jobs.md")
	require.NoError(t, err)
	var inJobs []string
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllStringSubmatch(string(jobs), -1) {
		inJobs = append(inJobs, m[1])
	}
	slices.Sort(jobFlags)
	slices.Sort(inJobs)
	assert.Equal(t, jobFlags, inJobs, "docs/jobs.md's flag table and hpcvmm run's Job flags")
	slices.Sort(inTable)
	slices.Sort(flags)
	assert.Equal(t, flags, inTable, "docs/running.md's flag table and hpcvmm run's flags")
	assert.Empty(t, singleDashLong.FindAllString(strings.ReplaceAll(section, "--p2p=false", ""), -1), "GNU-style flags in docs/running.md's run section")
	assert.Contains(t, section, "Exit status: 0 when the guest reboots or powers off; 1 ")
	assert.Contains(t, section, "2 for invalid input")
	assert.Contains(t, section, "3 when the host cannot run the VM")
	assert.Contains(t, section, "`Ctrl-A Ctrl-A`")
}

func TestVersion(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/hpcvmm/hpcvmm", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "e032ada0123456789abcdef0123456789abcdef0"},
			{Key: "vcs.time", Value: "2026-11-24T02:09:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	assert.Equal(t, "hpcvmm v0.3.0\nrevision e032ada0123456789abcdef0123456789abcdef0 (modified: built with uncommitted changes), committed 2026-11-24T02:09:00Z\nbuilt with go1.26.8\n", formatVersion(bi))
	bi.Settings[3].Value = "false"
	assert.Equal(t, "hpcvmm v0.3.0\nrevision e032ada0123456789abcdef0123456789abcdef0, committed 2026-11-24T02:09:00Z\nbuilt with go1.26.8\n", formatVersion(bi))
	bi.Settings = nil
	bi.Main.Version = "(devel)"
	assert.Contains(t, formatVersion(bi), "hpcvmm (devel)\nrevision unknown: built without VCS information")

	// The test binary's own build information, through the command.
	rc, out, errs := hpcvmm("version")
	assert.Equal(t, 0, rc, errs)
	real, ok := debug.ReadBuildInfo()
	require.True(t, ok)
	assert.Equal(t, formatVersion(real), out)
	rc, out2, _ := hpcvmm("--version")
	assert.Equal(t, 0, rc)
	assert.Equal(t, out, out2)
}

// TestSeccompFlag: filters are on unless --seccomp says otherwise, and a
// bad value names the flag.
func TestSeccompFlag(t *testing.T) {
	for args, want := range map[string]vmm.SeccompMode{"": vmm.SeccompOn, "--seccomp=off": vmm.SeccompOff, "--seccomp=log": vmm.SeccompLog, "--seccomp=on": vmm.SeccompOn} {
		c, f := newRunCommand()
		var out, errOut bytes.Buffer
		var a []string
		if args != "" {
			a = []string{args}
		}
		require.Equal(t, -1, c.parse(a, &out, &errOut), "%s: %s", args, errOut.String())
		assert.Equal(t, want, f.toConfig().Seccomp, "%q", args)
	}
	c, _ := newRunCommand()
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, c.parse([]string{"--seccomp=strict"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "--seccomp")
}

// TestUnbindRefusesALooseStateDirectory: `hpcvmm unbind` with a state
// directory others can write refuses it in one line naming the directory
// and the fix (exit 3: the host, not the input, is wrong), and lists
// nothing as restored.
func TestUnbindRefusesALooseStateDirectory(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "1-00.json"), []byte(`{"pid":1,"changes":[]}`), 0o600))
	rc, out, errs := hpcvmm("unbind", "--state-dir", dir)
	assert.Equal(t, exitHost, rc, errs)
	assert.NotContains(t, out, "restored:")
	assert.Equal(t, 1, strings.Count(errs, "\n"), errs)
	assert.Contains(t, errs, "hpcvmm unbind: hoststate: state directory "+dir)
	assert.Contains(t, errs, "chmod go-w "+dir)
}

// TestCPUModeFlag: --cpu-mode sets Config.CPUMode (auto by default), and a
// bad value names the flag.
func TestCPUModeFlag(t *testing.T) {
	for args, want := range map[string]vmm.CPUMode{"": vmm.CPUModeAuto, "--cpu-mode=auto": vmm.CPUModeAuto,
		"--cpu-mode=dedicated": vmm.CPUModeDedicated, "--cpu-mode=shared": vmm.CPUModeShared} {
		c, f := newRunCommand()
		var out, errOut bytes.Buffer
		var a []string
		if args != "" {
			a = []string{args}
		}
		require.Equal(t, -1, c.parse(a, &out, &errOut), "%s: %s", args, errOut.String())
		assert.Equal(t, want, f.toConfig().CPUMode, "%q", args)
	}
	c, _ := newRunCommand()
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, c.parse([]string{"--cpu-mode=exclusive"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "--cpu-mode")
}

// isJobFlag reports whether the flag is in the run command's Job group.
func isJobFlag(c *command, name string) bool {
	for _, g := range c.groups {
		if g.title == "Job" {
			return g.fs.Lookup(name) != nil
		}
	}
	return false
}
