package hoststate

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
)

// SetVFIdentity gives InfiniBand VF t.VF the GUIDs and link state of s on
// its PF's netdev: the current values are read, journaled (synced) with
// what is about to change, and only then set, one netlink message per
// attribute (port GUID, node GUID, link state). On failure the values set
// so far are put back. Settings with nothing to set change nothing. s must
// be resolved (no guid=auto left).
func (j *Journal) SetVFIdentity(t ibvf.Target, s ibvf.Settings) error {
	if s.Empty() {
		return nil
	}
	if s.Auto {
		return fmt.Errorf("hoststate: VF %s: guid=auto not resolved to GUIDs", t.VF)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	nlk := j.opts.Netlink
	cur, err := nlk.Identity(t.Netdev, t.Index)
	if err != nil {
		return fmt.Errorf("hoststate: VF %s: read its identity from %s before changing it (nothing changed): %w", t.VF, t.Netdev, err)
	}
	c := Change{Kind: KindIBVF, BDF: t.VF.String(), IBVF: &IBVFChange{
		PF: t.PF.String(), Netdev: t.Netdev, VFIndex: t.Index,
		SetNode: s.NodeGUID != 0, SetPort: s.PortGUID != 0, SetLink: s.SetLink,
		NodeGUID: cur.NodeGUID, PortGUID: cur.PortGUID, Link: cur.Link,
	}}
	j.f.Changes = append(j.f.Changes, c)
	if err := j.save(); err != nil {
		j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
		return fmt.Errorf("hoststate: VF %s: journal not written, nothing changed: %w", t.VF, err)
	}
	err = setIdentity(nlk, t.Netdev, t.Index, s.NodeGUID, s.PortGUID, s.Link, c.IBVF)
	if err != nil {
		uerr := undoIBVF(j.opts, c)
		if uerr == nil {
			j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
			j.save()
		}
		return errors.Join(fmt.Errorf("hoststate: VF %s: %w", t.VF, err), uerr)
	}
	return nil
}

// setIdentity sends the messages for the attributes v says to change: the
// port GUID first (the one whose zero keeps the link down), then the node
// GUID, then the link state.
func setIdentity(nlk ibvf.Netlink, netdev string, vf int, node, port ibvf.GUID, link ibvf.LinkState, v *IBVFChange) error {
	if v.SetPort {
		if err := nlk.SetPortGUID(netdev, vf, port); err != nil {
			return err
		}
	}
	if v.SetNode {
		if err := nlk.SetNodeGUID(netdev, vf, node); err != nil {
			return err
		}
	}
	if v.SetLink {
		if err := nlk.SetLinkState(netdev, vf, link); err != nil {
			return err
		}
	}
	return nil
}

// undoIBVF puts back the values a KindIBVF change recorded, on the PF's
// netdev as it is named now.
func undoIBVF(o Options, c Change) error {
	v := c.IBVF
	if v == nil {
		return fmt.Errorf("hoststate: restore VF %s: journal entry without its values; check it with ip link show", c.BDF)
	}
	netdev := v.Netdev
	if pf, err := host.ParseBDF(v.PF); err == nil {
		if ifs, err := host.New(o.SysfsRoot, o.ProcRoot).NetInterfaces(pf); err == nil && len(ifs) > 0 && !contains(ifs, netdev) {
			netdev = ifs[0] // renamed while the VM ran
		}
	}
	if err := setIdentity(o.Netlink, netdev, v.VFIndex, v.NodeGUID, v.PortGUID, v.Link, v); err != nil {
		return fmt.Errorf("hoststate: restore VF %s on %s VF %d (node GUID %s, port GUID %s, link %s): %w; set them by hand with ip link set %s vf %d node_guid G port_guid G state S",
			c.BDF, netdev, v.VFIndex, v.NodeGUID, v.PortGUID, v.Link, err, netdev, v.VFIndex)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
