// Validation of a journal's changes (a journal is a file another local user
// may have written): steps, drivers, netdevs, PCI addresses.

package hoststate

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
)

// validStep reports whether s looks like a SLURM_STEP_ID: a number or a
// name such as "batch" or "extern", short and plain.
func validStep(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '.' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

// validDriver reports whether s can be a kernel driver's name (a directory
// of /sys/bus/pci/drivers): letters, digits, '_', '-', '.', '+', not
// starting with '.', at most 64 bytes.
func validDriver(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-' || c == '.' || c == '+') {
			return false
		}
	}
	return true
}

// validNetdev reports whether s can be a network interface name
// (dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or space).
func validNetdev(s string) bool {
	if s == "" || len(s) >= 16 || s == "." || s == ".." {
		return false
	}
	for _, c := range s {
		if c == '/' || c == ':' || c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// validBDF reports whether s is a PCI address in the canonical form
// hpcvmm writes (0000:82:00.0), the form sysfs names devices by.
func validBDF(s string) bool {
	b, err := host.ParseBDF(s)
	return err == nil && b.String() == s
}

// validate checks what a change read from a journal will turn into sysfs
// path parts, written values and netlink targets.
func (c Change) validate() error {
	switch c.Kind {
	case KindVFIOOwner:
		if v := c.VFIOOwner; v != nil && (v.Group < 0 || v.Group > maxVFIOGroup || v.OriginalMode > 0o7777) {
			return fmt.Errorf("vfio_owner group %d mode %#o is not a VFIO group file's", v.Group, v.OriginalMode)
		}
		return nil // a missing entry: undoVFIOOwner says what to do
	case KindTAP:
		if v := c.TAP; v != nil && (!validNetdev(v.Name) || v.Bridge != "" && !validNetdev(v.Bridge)) {
			return fmt.Errorf("tap %q (bridge %q) is not a network interface name", v.Name, v.Bridge)
		}
		return nil
	case KindPCIBind, KindIBVF:
	default:
		return nil // undoChange refuses it, naming the kind
	}
	if !validBDF(c.BDF) {
		return fmt.Errorf("BDF %q is not a PCI address such as 0000:82:00.0", c.BDF)
	}
	switch c.Kind {
	case KindPCIBind:
		if c.OriginalDriver != "" && !validDriver(c.OriginalDriver) {
			return fmt.Errorf("original_driver %q is not a driver name", c.OriginalDriver)
		}
		if c.OriginalOverride != "" && !validDriver(c.OriginalOverride) {
			return fmt.Errorf("original_override %q is not a driver name", c.OriginalOverride)
		}
	case KindIBVF:
		v := c.IBVF
		if v == nil {
			return nil // undoIBVF says what to do
		}
		if !validBDF(v.PF) {
			return fmt.Errorf("ib_vf.pf %q is not a PCI address such as 0000:82:00.0", v.PF)
		}
		if !validNetdev(v.Netdev) {
			return fmt.Errorf("ib_vf.netdev %q is not a network interface name", v.Netdev)
		}
		if v.VFIndex < 0 || v.VFIndex > 0xffff {
			return fmt.Errorf("ib_vf.vf_index %d is not a VF number", v.VFIndex)
		}
	}
	return nil
}
