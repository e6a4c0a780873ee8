package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vfio"
	virtionet "github.com/hpcvmm/hpcvmm/virtio/net"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// bindRequest is what `hpcvmm bind` was asked, flags as given.
type bindRequest struct {
	p vmm.PassthroughConfig
	// ifAny: a job without the gpu or nic GRES asked for binds none.
	ifAny bool
	// owner is --owner: the user the devices' VFIO groups and the TAPs
	// are handed to ("" for none).
	owner string
	// taps are the --tap values, NAME[,bridge=BRIDGE].
	taps []string
}

// bindIdent is an InfiniBand VF identity to set.
type bindIdent struct {
	t ibvf.Target
	s ibvf.Settings
}

// tapSpec is one --tap.
type tapSpec struct{ name, bridge string }

// bindPlan is everything `hpcvmm bind` will change, checked before the
// first change.
type bindPlan struct {
	bdfs   []host.BDF
	idents []bindIdent
	// groups are the VFIO groups of bdfs, handed to owner when set.
	groups []int
	owner  *asuser.User
	taps   []tapSpec
}

// planBind checks a bind request and resolves it against the host and
// Slurm: the devices (the job's, under Slurm), their InfiniBand identities,
// their VFIO groups when an owner is given, the owner and the TAPs. An
// error is invalid input (exit status 2); nothing has changed.
func planBind(r bindRequest, env *slurm.Env, log *slog.Logger) (*bindPlan, error) {
	if len(r.p.GPUs)+len(r.p.VFs)+len(r.taps) == 0 {
		return nil, errors.New("no device given: name the PCI functions, e.g. hpcvmm bind 0000:82:00.0")
	}
	pl := &bindPlan{}
	if r.owner != "" {
		u, err := parseOwner(r.owner)
		if err != nil {
			return nil, err
		}
		pl.owner = u
	}
	for _, s := range r.taps {
		ts, err := parseTapSpec(s)
		if err != nil {
			return nil, err
		}
		if pl.owner == nil {
			return nil, fmt.Errorf("--tap %s needs --owner USER: the TAP is made for the user whose job opens it without CAP_NET_ADMIN", s)
		}
		pl.taps = append(pl.taps, ts)
	}
	p := r.p
	if err := expandSlurmDevices(&p, env, r.ifAny, log); err != nil {
		return nil, err
	}
	seed := ibvf.Seed{Cluster: env.Getenv("SLURM_CLUSTER_NAME"), Job: env.Getenv("SLURM_JOB_ID")}
	if env.InSlurm() {
		seed.Node, _ = env.NodeName()
	}
	for _, s := range p.GPUs {
		sp, err := vfio.ParseSpec(s, false)
		if err != nil {
			return nil, err
		}
		pl.bdfs = append(pl.bdfs, sp.BDF)
	}
	for _, s := range p.VFs {
		sp, err := vfio.ParseSpec(s, true)
		if err != nil {
			return nil, err
		}
		pl.bdfs = append(pl.bdfs, sp.BDF)
		if sp.IB.Empty() {
			continue
		}
		if err := sp.IB.Resolve(seed, sp.BDF); err != nil {
			return nil, fmt.Errorf("--vf %s: %v", s, err)
		}
		t, err := ibvf.Locate(env.Host, sp.BDF)
		if err != nil {
			return nil, fmt.Errorf("--vf %s: %v", s, err)
		}
		pl.idents = append(pl.idents, bindIdent{t, sp.IB})
	}
	if pl.owner != nil {
		groups, err := vfioGroups(env.Host, pl.bdfs)
		if err != nil {
			return nil, err
		}
		pl.groups = groups
	}
	return pl, nil
}

// vfioGroups returns the IOMMU groups of bdfs, each once, in order: the
// /dev/vfio files of exactly these devices, never another job's.
func vfioGroups(h *host.Host, bdfs []host.BDF) ([]int, error) {
	var groups []int
	for _, b := range bdfs {
		d, err := h.Device(b)
		if err != nil {
			return nil, fmt.Errorf("--owner: %s: %w", b, err)
		}
		if d.IOMMUGroup < 0 {
			return nil, fmt.Errorf("--owner: %s is in no IOMMU group, so it has no VFIO group file to hand over (is the IOMMU on?)", b)
		}
		if !slices.Contains(groups, d.IOMMUGroup) {
			groups = append(groups, d.IOMMUGroup)
		}
	}
	return groups, nil
}

// parseOwner reads --owner: a login name or a numeric uid the system
// knows, with its primary group.
func parseOwner(s string) (*asuser.User, error) {
	uid, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		u, lerr := user.Lookup(s)
		if lerr != nil {
			return nil, fmt.Errorf("--owner %q: no such user (%v): give the job's user, e.g. --owner \"$SLURM_JOB_UID\"", s, lerr)
		}
		if uid, err = strconv.ParseUint(u.Uid, 10, 32); err != nil {
			return nil, fmt.Errorf("--owner %q: uid %q is not numeric", s, u.Uid)
		}
	}
	u, err := asuser.Lookup(uint32(uid))
	if err != nil {
		return nil, fmt.Errorf("--owner %q: %w", s, err)
	}
	return u, nil
}

// parseTapSpec reads --tap NAME[,bridge=BRIDGE] and checks, before
// anything changes, that the name is free and the bridge is one.
func parseTapSpec(s string) (tapSpec, error) {
	name, rest, _ := strings.Cut(s, ",")
	ts := tapSpec{name: name}
	if err := virtionet.ValidateTAPName(name); err != nil {
		return ts, fmt.Errorf("--tap %s: %v", s, err)
	}
	for rest != "" {
		var kv string
		kv, rest, _ = strings.Cut(rest, ",")
		k, v, _ := strings.Cut(kv, "=")
		if k != "bridge" || v == "" {
			return ts, fmt.Errorf("--tap %s: %q: the only option is bridge=BRIDGE", s, kv)
		}
		ts.bridge = v
	}
	if exists, err := uapi.InterfaceExists(name); err != nil {
		return ts, fmt.Errorf("--tap %s: %v", s, err)
	} else if exists {
		return ts, fmt.Errorf("--tap %s: an interface %s exists already: choose another name (e.g. one with $SLURM_JOB_ID in it), or remove a stale one (ip link del %s)", s, name, name)
	}
	if ts.bridge != "" {
		if err := hoststate.CheckBridge(ts.bridge); err != nil {
			return ts, fmt.Errorf("--tap %s: %v", s, err)
		}
	}
	return ts, nil
}

// applyBind makes the plan's changes, each journaled in j first, and says
// on stdout what it did: devices to vfio-pci, InfiniBand identities, the
// VFIO group files to the owner, the TAPs.
func applyBind(pl *bindPlan, j *hoststate.Journal, devRoot string, stdout io.Writer) error {
	for _, b := range pl.bdfs {
		if err := j.Bind(b); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s bound to vfio-pci (hpcvmm unbind %s restores it; journal %s)\n", b, b, j.Path())
	}
	for _, id := range pl.idents {
		if err := j.SetVFIdentity(id.t, id.s); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s set on %s VF %d (hpcvmm unbind %s restores the previous values; journal %s)\n", id.t.VF, id.s, id.t.Netdev, id.t.Index, id.t.VF, j.Path())
	}
	for _, g := range pl.groups {
		if err := j.GiveVFIOGroup(g, pl.owner.UID); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s/vfio/%d handed to %s (hpcvmm unbind gives it back; journal %s)\n", devRoot, g, pl.owner, j.Path())
	}
	for _, ts := range pl.taps {
		if err := j.CreateTAP(ts.name, ts.bridge, pl.owner.UID, pl.owner.GID); err != nil {
			return err
		}
		on := ""
		if ts.bridge != "" {
			on = " on bridge " + ts.bridge
		}
		fmt.Fprintf(stdout, "TAP %s%s for %s: persistent, up (hpcvmm run --net tap=%s as that user opens it; hpcvmm unbind deletes it; journal %s)\n", ts.name, on, pl.owner, ts.name, j.Path())
	}
	if len(pl.bdfs)+len(pl.taps) == 0 {
		fmt.Fprintln(stdout, "nothing to bind: this job holds none of the devices asked for on this node")
	}
	return nil
}
