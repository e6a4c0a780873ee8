package preflight

import (
	"fmt"
	"math"

	"github.com/hpcvmm/hpcvmm/host"
)

func alignUp(v, a uint64) uint64 {
	if v > math.MaxUint64-(a-1) {
		return math.MaxUint64
	}
	return (v + a - 1) &^ (a - 1)
}

// Run performs every check for req against h. It never stops early: the
// admin gets every problem and its fix in one pass.
func Run(h *host.Host, req Request) Report {
	c := &checker{h: h, req: req, rep: Report{Node: -1}}
	c.request()
	c.kvm()
	c.iommu()
	c.devicesChecks()
	c.barSpace()
	c.node()
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

// humanSize renders a byte count in its largest unit: exactly when the
// unit divides it ("128G"), else with one decimal ("128.0G").
func humanSize(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v >= 1<<u.shift {
			if v%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
			}
			return fmt.Sprintf("%.1f%s", float64(v)/float64(uint64(1)<<u.shift), u.suffix)
		}
	}
	return fmt.Sprintf("%d", v)
}
