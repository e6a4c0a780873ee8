package preflight

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
)

// Run performs every check for req against h. It never stops early: the
// admin gets every problem and its fix in one pass.
func Run(h *host.Host, req Request) Report {
	c := &checker{h: h, req: req, rep: Report{Node: -1}}
	c.request()
	c.kvm()
	c.iommu()
	c.devicesChecks()
	c.gpuDriverChecks()
	c.barSpace()
	c.node()
	c.cpuMode()
	c.memlock()
	c.placement()
	return c.rep
}

type checker struct {
	h   *host.Host
	req Request
	rep Report
	// devs are the requested devices that exist, in request order.
	devs   []reqDev
	chosen *host.Node
}

type reqDev struct {
	d    *host.Device
	isVF bool
}

func (c *checker) add(name, subject string, st Status, fix, format string, args ...any) {
	c.rep.Results = append(c.rep.Results, Result{Name: name, Subject: subject, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix})
}
