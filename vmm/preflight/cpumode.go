package preflight

import (
	"fmt"
	"slices"

	"github.com/hpcvmm/hpcvmm/cpuclaim"
	"github.com/hpcvmm/hpcvmm/host"
)

// cpuMode reports the CPU mode the VM would get on the chosen node
// (dedicated: each vCPU on a host CPU of its own, claimed against other
// hpcvmm VMs; shared otherwise) and fails when dedicated was asked for and
// the node's free CPUs cannot give it. The CPUs other VMs claim are
// counted when the request names the run directory (RunDir).
func (c *checker) cpuMode() {
	if c.chosen == nil || c.req.CPUs <= 0 {
		return
	}
	n := c.chosen
	subj := fmt.Sprintf("node %d", n.ID)
	free := n.CPUs
	claimed := ""
	if c.req.RunDir != "" {
		held, err := cpuclaim.Held(c.req.RunDir, n.CPUs)
		if err != nil {
			c.add("cpu-mode", subj, Warn, "make the run directory root-owned and not writable by group or others", "other VMs' CPU claims unreadable: %v", err)
		} else if len(held) > 0 {
			free = slices.DeleteFunc(slices.Clone(n.CPUs), func(cpu int) bool { return slices.Contains(held, cpu) })
			claimed = fmt.Sprintf("; %s claimed by other VMs (%s)", host.FormatCPUList(held), cpuclaim.Dir(c.req.RunDir))
		}
	}
	enough := len(free) >= c.req.CPUs
	detail := fmt.Sprintf("%s, %s of %d on node %d%s", count(c.req.CPUs, "vCPU"), count(len(free), "free CPU"), len(n.CPUs), n.ID, claimed)
	switch {
	case c.req.CPUMode == "shared":
		c.add("cpu-mode", subj, Pass, "", "shared (requested): idle vCPUs exit to the host; %s", detail)
	case enough:
		c.add("cpu-mode", subj, Pass, "", "dedicated: each vCPU on a host CPU of its own (%s), idle vCPUs keep it", detail)
	case c.req.CPUMode == "dedicated":
		c.add("cpu-mode", subj, Fail, fmt.Sprintf("use --cpus %d, wait for another VM to end, or --cpu-mode shared", len(free)),
			"dedicated needs a host CPU of its own per vCPU: %s", detail)
	default:
		c.add("cpu-mode", subj, Warn, fmt.Sprintf("use --cpus %d or wait for another VM to end for dedicated vCPUs", len(free)),
			"shared: vCPUs will share host CPUs, idle ones exit to the host: %s", detail)
	}
}
