//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// checkReport is `hpcvmm check --json` output.
type checkReport struct {
	OK      bool               `json:"ok"`
	Node    int                `json:"node"`
	Results []preflight.Result `json:"results"`
}

// runCheck runs `hpcvmm check --json args...` and returns its exit status
// and parsed report.
func runCheck(t *testing.T, env *harness.Env, args ...string) (int, checkReport) {
	t.Helper()
	cmd := exec.Command(env.HPCVMM(t), append([]string{"check", "--json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	rc := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		rc = ee.ExitCode()
	} else {
		require.NoError(t, err, "hpcvmm check %s", strings.Join(args, " "))
	}
	var rep checkReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "hpcvmm check --json output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	t.Logf("hpcvmm check %s: exit %d\n%s", strings.Join(args, " "), rc, formatReport(rep))
	return rc, rep
}

func formatReport(rep checkReport) string {
	var b strings.Builder
	for _, r := range rep.Results {
		b.WriteString(r.Status.String() + "  " + r.Name + "  " + r.Subject + "  " + r.Detail + "\n")
		if r.Fix != "" && r.Status != preflight.Pass {
			b.WriteString("      fix: " + r.Fix + "\n")
		}
	}
	return b.String()
}

// findResult returns the result named name about subject ("" matches any).
func findResult(rep checkReport, name, subject string) (preflight.Result, bool) {
	for _, r := range rep.Results {
		if r.Name == name && (subject == "" || r.Subject == subject) {
			return r, true
		}
	}
	return preflight.Result{}, false
}

// failedNames lists the names of failed checks, as "name(subject)".
func failedNames(rep checkReport) []string {
	var out []string
	for _, r := range rep.Results {
		if r.Status == preflight.Fail {
			out = append(out, r.Name+"("+r.Subject+")")
		}
	}
	return out
}

// TestCheckPassthrough runs `hpcvmm check --gpu <edu> --vf <VF> --memory 1G`
// in the passthrough L1: it passes with both devices on vfio-pci and two
// 1 GiB hugepages reserved; it fails, naming the driver and giving the
// rebinding as the fix, with the VF still on the host's nvme driver; and
// it fails, giving the nr_hugepages write as the fix, when the VM needs
// more 1 GiB pages than are free.
func TestCheckPassthrough(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		t.Cleanup(func() {
			setDriver(t, harness.EduBDF, "")
			setDriver(t, harness.NVMeVFBDF, "")
		})
		devs := []string{"--gpu", harness.EduBDF, "--vf", harness.NVMeVFBDF}

		t.Run("ready", func(t *testing.T) {
			setDriver(t, harness.EduBDF, "vfio-pci")
			setDriver(t, harness.NVMeVFBDF, "vfio-pci")
			rc, rep := runCheck(t, env, append(devs, "--memory", "1G")...)
			assert.Equal(t, 0, rc, "exit status; failed: %v", failedNames(rep))
			assert.True(t, rep.OK)
			assert.Empty(t, failedNames(rep))
			for _, c := range []struct{ name, subject string }{
				{"iommu", "host"}, {"driver", harness.EduBDF}, {"driver", harness.NVMeVFBDF}, {"hugepages", ""},
			} {
				r, ok := findResult(rep, c.name, c.subject)
				if assert.True(t, ok, "no %s check for %s", c.name, c.subject) {
					assert.Equal(t, preflight.Pass, r.Status, "%s %s: %s", c.name, c.subject, r.Detail)
				}
			}
			if r, ok := findResult(rep, "sr-iov", harness.NVMeVFBDF); assert.True(t, ok, "no sr-iov check for the VF") {
				assert.Contains(t, r.Detail, harness.NVMePFBDF, "the VF check names the PF")
			}
			p, w, f := 0, 0, 0
			for _, r := range rep.Results {
				switch r.Status {
				case preflight.Pass:
					p++
				case preflight.Warn:
					w++
				default:
					f++
				}
			}
			env.Record(t, "checks", strings.Join([]string{itoa(p) + "_pass", itoa(w) + "_warn", itoa(f) + "_fail"}, ","))
		})

		t.Run("device on its host driver", func(t *testing.T) {
			setDriver(t, harness.EduBDF, "vfio-pci")
			setDriver(t, harness.NVMeVFBDF, "nvme")
			rc, rep := runCheck(t, env, append(devs, "--memory", "1G")...)
			assert.Equal(t, 3, rc, "exit status: the host cannot run it (docs/cli.md)")
			assert.False(t, rep.OK)
			r, ok := findResult(rep, "driver", harness.NVMeVFBDF)
			require.True(t, ok, "no driver check for the VF")
			assert.Equal(t, preflight.Fail, r.Status)
			assert.Contains(t, r.Detail, "bound to nvme")
			assert.Contains(t, r.Fix, "hpcvmm bind "+harness.NVMeVFBDF)
			assert.Contains(t, r.Fix, "echo vfio-pci > /sys/bus/pci/devices/"+harness.NVMeVFBDF+"/driver_override")
			assert.Contains(t, r.Fix, "/driver/unbind")
			assert.Equal(t, []string{"driver(" + harness.NVMeVFBDF + ")"}, failedNames(rep), "only the VF's driver fails")
			env.Record(t, "fix", r.Fix)
		})

		t.Run("too few hugepages", func(t *testing.T) {
			setDriver(t, harness.EduBDF, "vfio-pci")
			setDriver(t, harness.NVMeVFBDF, "vfio-pci")
			free := readHugeState(t).free1G
			need := free + 1
			rc, rep := runCheck(t, env, append(devs, "--memory", itoa(int(need))+"G", "--hugepages", "1G")...)
			assert.Equal(t, 3, rc, "exit status: the host cannot run it (docs/cli.md)")
			r, ok := findResult(rep, "hugepages", "")
			require.True(t, ok, "no hugepages check")
			assert.Equal(t, preflight.Fail, r.Status)
			assert.Contains(t, r.Detail, itoa(int(free))+" of the pool's ")
			assert.Contains(t, r.Detail, "VM needs "+itoa(int(need)))
			assert.Contains(t, r.Fix, "hugepages-1048576kB/nr_hugepages")
			assert.Contains(t, r.Fix, "echo ")
			env.Record(t, "fix", r.Fix)
		})
	})
}

// TestCheckWithoutIOMMU runs `hpcvmm check` for a device in an L1 without
// an IOMMU (ProfileBasic): it fails, saying the kernel uses no IOMMU and
// how to turn it on.
func TestCheckWithoutIOMMU(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		// Any PCI function will do: q35's SATA controller.
		const dev = "0000:00:1f.2"
		rc, rep := runCheck(t, env, "--gpu", dev, "--memory", "1G")
		assert.Equal(t, 3, rc, "exit status: the host cannot run it (docs/cli.md)")
		r, ok := findResult(rep, "iommu", "host")
		require.True(t, ok, "no iommu check")
		assert.Equal(t, preflight.Fail, r.Status)
		assert.Contains(t, r.Detail, "no IOMMU groups")
		assert.Regexp(t, `(intel|amd)_iommu=on`, r.Fix)
		assert.Contains(t, r.Fix, "GRUB_CMDLINE_LINUX")
		if g, ok := findResult(rep, "iommu-group", dev); assert.True(t, ok, "no iommu-group check for %s", dev) {
			assert.Equal(t, preflight.Fail, g.Status)
		}
		env.Record(t, "fix", r.Fix)
	})
}

func itoa(n int) string { return strconv.Itoa(n) }
