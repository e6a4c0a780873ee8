package slurm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
)

// The GRES names hpcvmm resolves.
const (
	GPU = "gpu"
	NIC = "nic"
)

// Env is what resolution reads from the process and the host. Fields left
// nil or empty read the live system.
type Env struct {
	// LookupEnv reads an environment variable; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Hostname is the node name when SLURMD_NODENAME is unset; nil means
	// os.Hostname.
	Hostname func() (string, error)
	// Host reads the IOMMU groups; nil means host.New("/sys", "/proc").
	Host *host.Host
	// DevDir is where the VFIO group files are looked for, with the
	// /dev/vfio/ of gres.conf's File= replaced by DevDir/vfio/; "" means
	// "/dev".
	DevDir string
	// Squeue returns `squeue --json --jobs JOBID`; nil runs squeue. It
	// is used only where Slurm sets no variable: the nic GRES in a
	// Prolog/Epilog (see JobGRESIndices), and the job's memory in a step a
	// bare srun created (srun exports no SLURM_MEM_PER_NODE; sbatch and
	// salloc do; see JobMemory).
	Squeue func(jobID string) ([]byte, error)
}

func (e *Env) lookup(k string) (string, bool) {
	if e.LookupEnv == nil {
		return os.LookupEnv(k)
	}
	return e.LookupEnv(k)
}

func (e *Env) getenv(k string) string { v, _ := e.lookup(k); return v }

// Getenv returns an environment variable as Env sees it, "" when unset.
func (e *Env) Getenv(k string) string { return e.getenv(k) }

func (e *Env) host() *host.Host {
	if e.Host == nil {
		e.Host = host.New("/sys", "/proc")
	}
	return e.Host
}

// InSlurm reports whether the process runs inside a Slurm job (a step,
// a batch script, or a Prolog/Epilog).
func (e *Env) InSlurm() bool {
	_, ok := e.lookup("SLURM_JOB_ID")
	return ok
}

// NodeName is the Slurm name of this node: SLURMD_NODENAME, which slurmd
// sets for steps and Prolog/Epilog alike, else the host name.
func (e *Env) NodeName() (string, error) {
	if n := e.getenv("SLURMD_NODENAME"); n != "" {
		return n, nil
	}
	hn := e.Hostname
	if hn == nil {
		hn = os.Hostname
	}
	n, err := hn()
	if err != nil {
		return "", fmt.Errorf("slurm: no SLURMD_NODENAME and no host name: %w", err)
	}
	return n, nil
}

// Selection is what one GRES resolved to.
type Selection struct {
	// Name is the GRES ("gpu", "nic").
	Name string
	// Source says where Slurm's answer came from, for logs and errors:
	// "SLURM_STEP_GPUS=0,1".
	Source string
	// Devices are the gres.conf device files the job got, in Slurm's order.
	Devices []Device
	// Groups are their VFIO groups, Groups[i] for Devices[i].
	Groups []int
	// Functions are the PCI functions of those groups, bridges left out
	// (the kernel does not need them in VFIO), in group order.
	Functions []host.BDF
}

// NICPrefix is what gres_nic.c puts before each number of SLURM_STEP_NICS
// and SLURM_JOB_NICS (the prefix argument of common_gres_set_env, a
// leftover of Open MPI's openib BTL naming): a step given /dev/vfio/13
// sees SLURM_STEP_NICS=mlx4_13 (observed with Slurm 22.05.8).
const NICPrefix = "mlx4_"

// variables returns the step and job variables of a GRES, whether their
// values are dev_num (nic) rather than indices (gpu), and the prefix of
// each value; see the package documentation.
func variables(name string) (step, job string, devNum bool, prefix string, err error) {
	switch name {
	case GPU:
		return "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", false, "", nil
	case NIC:
		return "SLURM_STEP_NICS", "SLURM_JOB_NICS", true, NICPrefix, nil
	}
	return "", "", false, "", fmt.Errorf("slurm: GRES %q: hpcvmm resolves gpu and nic (the GRES Slurm 22.05 constrains with a plugin)", name)
}

// ErrNoGRES is what Resolve's error wraps (errors.Is) when Slurm gave the
// job none of the GRES asked for on this node: no variable names any, or
// squeue's gres_detail holds none for this node. A Prolog that binds "the
// job's devices if it has any" (hpcvmm bind --if-any) treats it as nothing
// to do; every other error (a gres.conf that does not match, a group not on
// this host) stays an error.
var ErrNoGRES = errors.New("slurm: the job holds none of this GRES on this node")

// noGRES is an error that says which GRES is missing and why, and is
// ErrNoGRES for errors.Is.
type noGRES struct{ msg string }

func (e noGRES) Error() string        { return e.msg }
func (e noGRES) Is(target error) bool { return target == ErrNoGRES }

func noGRESf(format string, a ...any) error { return noGRES{fmt.Sprintf(format, a...)} }

// ErrNodeSetup is what Resolve's error wraps (errors.Is) when the node is
// at fault, not the job's request: no gres.conf, or one that does not
// declare the job's devices for this node by their VFIO groups, a group
// file missing (its devices not on vfio-pci), not the job user's or held
// by another process, an IOMMU group not on this host. hpcvmm exits 3 on
// it, the status an Epilog or health check drains a node on.
var ErrNodeSetup = errors.New("slurm: the node's setup does not match its gres.conf")

// nodeSetup is an error of the node's setup: ErrNodeSetup for errors.Is,
// with its own message and cause.
type nodeSetup struct{ err error }

func (e nodeSetup) Error() string        { return e.err.Error() }
func (e nodeSetup) Unwrap() error        { return e.err }
func (e nodeSetup) Is(target error) bool { return target == ErrNodeSetup }

func nodeSetupf(format string, a ...any) error { return nodeSetup{fmt.Errorf(format, a...)} }

// Resolve finds the devices Slurm gave this step (or job) of GRES name,
// their VFIO groups and the PCI functions in those groups, and checks that
// the job may open each group. Nothing on the host changes.
func (e *Env) Resolve(name string) (*Selection, error) {
	stepVar, jobVar, devNum, prefix, err := variables(name)
	if err != nil {
		return nil, err
	}
	if !e.InSlurm() {
		return nil, fmt.Errorf("slurm: --%s slurm needs a Slurm job, and SLURM_JOB_ID is not set: run hpcvmm with srun or in an sbatch script, or name the devices (--%s BDF)", flagOf(name), flagOf(name))
	}
	sel := &Selection{Name: name}
	// A Prolog/Epilog runs as root outside the job's cgroup, before the
	// devices are bound to vfio-pci: opening the group there proves
	// nothing, and its file may not exist yet.
	inScript := e.getenv("SLURM_SCRIPT_CONTEXT") != ""
	var values []int
	var byIndex bool
	if v, ok := e.lookup(stepVar); ok {
		sel.Source = stepVar + "=" + v
	} else if v, ok := e.lookup(jobVar); ok {
		sel.Source = jobVar + "=" + v
	}
	if sel.Source != "" {
		_, v, _ := strings.Cut(sel.Source, "=")
		if values, err = parsePrefixedList(v, prefix); err != nil {
			return nil, fmt.Errorf("slurm: %s: %w", sel.Source, err)
		}
		byIndex = !devNum
	} else if devNum && inScript {
		// Prolog/Epilog: the nic plugin sets nothing there.
		if values, sel.Source, err = e.squeueIndices(name); err != nil {
			return nil, err
		}
		byIndex = true
	} else {
		return nil, noGRESf("slurm: Slurm gave this job no %s: neither %s nor %s is set; request them with --gres=%s:N (and check gres.conf declares Name=%s on this node)", name, stepVar, jobVar, name, name)
	}
	conf, err := e.gresConf()
	if err != nil {
		return nil, nodeSetupf("slurm: %s is set but %w", sel.Source, err)
	}
	var mine []Device
	for _, d := range conf.Devices {
		if d.Name == name {
			mine = append(mine, d)
		}
	}
	if len(mine) == 0 {
		return nil, nodeSetupf("slurm: %s, but %s declares no Name=%s with File= for node %s: add a line such as Name=%s File=/dev/vfio/<group>%s",
			sel.Source, conf.Path, name, conf.Node, name, countedHint(conf, name))
	}
	for _, v := range values {
		d, ok := findDevice(mine, v, byIndex)
		if !ok {
			what := "index"
			if !byIndex {
				what = "device number (the number File= ends in)"
			}
			return nil, nodeSetupf("slurm: %s: no %s %s %d in %s for node %s (it declares %s): is this the gres.conf slurmd reads?",
				sel.Source, name, what, v, conf.Path, conf.Node, describeDevices(mine))
		}
		g, err := vfioGroup(d.File)
		if err != nil {
			return nil, nodeSetupf("slurm: %s gives %s, declared on %s line %d: %w", sel.Source, d.File, conf.Path, d.Line, err)
		}
		if !inScript {
			if err := e.openGroup(g, d, sel.Source); err != nil {
				return nil, err
			}
		}
		members, err := e.host().IOMMUGroupMembers(g)
		if err != nil {
			return nil, nodeSetupf("slurm: %s gives %s, but IOMMU group %d is not on this host (%w): check gres.conf against `hpcvmm devices`", sel.Source, d.File, g, err)
		}
		n := 0
		for _, b := range members {
			dev, err := e.host().Device(b)
			if err != nil {
				return nil, fmt.Errorf("slurm: IOMMU group %d: %w", g, err)
			}
			if sc := dev.SubClass(); sc == 0x0604 || sc == 0x0609 {
				continue // PCI bridges stay on the host; VFIO allows them in a group
			}
			sel.Functions = append(sel.Functions, b)
			n++
		}
		if n == 0 {
			return nil, nodeSetupf("slurm: %s gives %s, but IOMMU group %d has no device to pass through (only bridges)", sel.Source, d.File, g)
		}
		sel.Devices = append(sel.Devices, d)
		sel.Groups = append(sel.Groups, g)
	}
	if len(sel.Devices) == 0 {
		return nil, noGRESf("slurm: %s names no device: request them with --gres=%s:N", sel.Source, name)
	}
	return sel, nil
}

// parsePrefixedList parses Slurm's device list of a GRES: comma-separated
// numbers, each after prefix ("mlx4_13,mlx4_14" for nic). A value without
// the prefix is taken as a plain number list, the form of gpu and of the
// Prolog's scontrol indices.
func parsePrefixedList(v, prefix string) ([]int, error) {
	if prefix == "" || !strings.HasPrefix(v, prefix) {
		return ParseIndexList(v)
	}
	items := strings.Split(v, ",")
	for i, it := range items {
		num, ok := strings.CutPrefix(it, prefix)
		if !ok {
			return nil, fmt.Errorf("%q: item %q lacks the %q every other item has", v, it, prefix)
		}
		items[i] = num
	}
	return ParseIndexList(strings.Join(items, ","))
}

func flagOf(name string) string {
	if name == NIC {
		return "vf"
	}
	return name
}

func countedHint(conf *GresConf, name string) string {
	for _, c := range conf.Counted {
		if c.Name == name {
			return fmt.Sprintf(" (line %d has Name=%s with Count= but no File=, which names no device)", c.Line, name)
		}
	}
	return ""
}

func describeDevices(ds []Device) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("index %d = %s", d.Index, d.File))
	}
	return strings.Join(parts, ", ")
}

func findDevice(ds []Device, v int, byIndex bool) (Device, bool) {
	for _, d := range ds {
		if (byIndex && d.Index == v) || (!byIndex && d.DevNum == v) {
			return d, true
		}
	}
	return Device{}, false
}

// gresConf reads the gres.conf beside SLURM_CONF for this node.
func (e *Env) gresConf() (*GresConf, error) {
	node, err := e.NodeName()
	if err != nil {
		return nil, err
	}
	p := GresConfPath(e.getenv)
	gc, err := ReadGresConf(p, node)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("there is no gres.conf at %s (beside SLURM_CONF=%q, else %s): hpcvmm maps Slurm's device indices through it; see docs/slurm.md", p, e.getenv("SLURM_CONF"), DefaultGresConf)
	}
	if err != nil {
		return nil, err
	}
	// A short host name may be the node name when the FQDN is not.
	if len(gc.Devices) == 0 && e.getenv("SLURMD_NODENAME") == "" {
		if short, _, ok := strings.Cut(node, "."); ok {
			if g2, err := ReadGresConf(p, short); err == nil && len(g2.Devices) > 0 {
				return g2, nil
			}
		}
	}
	return gc, nil
}

// vfioGroup returns N of File=/dev/vfio/N, or says why File is not a VFIO
// group.
func vfioGroup(file string) (int, error) {
	clean := path.Clean(file)
	dir, base := path.Split(clean)
	g, err := strconv.Atoi(base)
	if dir != "/dev/vfio/" || err != nil || g < 0 || strconv.Itoa(g) != base {
		return 0, fmt.Errorf("%s is not a VFIO group (/dev/vfio/<group>): on a node that passes devices to VMs, declare each device in gres.conf by its VFIO group, e.g. File=/dev/vfio/12 (hpcvmm devices lists each device's group)", file)
	}
	return g, nil
}

// openGroup opens the group file read-write, as VFIO will, and closes it:
// the device cgroup of a job without that GRES answers EPERM.
func (e *Env) openGroup(g int, d Device, source string) error {
	dev := e.DevDir
	if dev == "" {
		dev = "/dev"
	}
	p := filepath.Join(dev, "vfio", strconv.Itoa(g))
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return nil
	}
	return groupOpenError(err, p, d, source)
}

// groupOpenError explains why the group file p could not be opened, in
// terms of what Slurm gave (source) and what to do.
func groupOpenError(err error, p string, d Device, source string) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("slurm: %s gives %s, but this job's device cgroup does not let it open %s (EPERM): the job was not allocated that %s; request it with --gres=%s:N, or fix gres.conf if the index is wrong", source, d.File, p, d.Name, d.Name)
	case errors.Is(err, unix.EACCES):
		return nodeSetupf("slurm: %s gives %s, but %s is not accessible to this user (EACCES): the Prolog must chown the job's VFIO groups to $SLURM_JOB_USER (see docs/slurm.md)", source, d.File, p)
	case errors.Is(err, unix.ENOENT):
		return nodeSetupf("slurm: %s gives %s, but %s does not exist: the group's devices are not bound to vfio-pci; bind them in the Prolog (hpcvmm bind) or on the node (see docs/slurm.md)", source, d.File, p)
	case errors.Is(err, unix.EBUSY):
		return nodeSetupf("slurm: %s gives %s, but %s is open in another process (EBUSY): another VM or job holds the group", source, d.File, p)
	}
	return fmt.Errorf("slurm: %s gives %s: open %s: %w", source, d.File, p, err)
}

// squeueIndices reads the job's indices of GRES name on this node from
// `squeue --json`, for the Prolog/Epilog.
func (e *Env) squeueIndices(name string) ([]int, string, error) {
	job := e.getenv("SLURM_JOB_ID")
	node, err := e.NodeName()
	if err != nil {
		return nil, "", err
	}
	out, err := e.squeue(job)
	if err != nil {
		return nil, "", fmt.Errorf("slurm: no SLURM_JOB_NICS here (%s), and `squeue --json --jobs %s` failed: %w", e.getenv("SLURM_SCRIPT_CONTEXT"), job, err)
	}
	idx, err := JobGRESIndices(out, job, node, name)
	if err != nil {
		return nil, "", fmt.Errorf("slurm: `squeue --json --jobs %s`: %w", job, err)
	}
	return idx, fmt.Sprintf("squeue --json --jobs %s: %s IDX:%s", job, name, host.FormatCPUList(idx)), nil
}

// squeue returns `squeue --json --jobs job`.
func (e *Env) squeue(job string) ([]byte, error) {
	if e.Squeue != nil {
		return e.Squeue(job)
	}
	return exec.Command("squeue", "--json", "--jobs", job).Output()
}

// squeueJobs is the part of `squeue --json` (Slurm 21.08 and later: the
// openapi job record) that hpcvmm reads: JobGRESIndices and JobMemory.
type squeueJobs struct {
	Jobs []squeueJob `json:"jobs"`
}

// squeueJob is one job record of `squeue --json`.
type squeueJob struct {
	JobID uint64 `json:"job_id"`
	// Nodes is the job's node list, a hostlist expression.
	Nodes string `json:"nodes"`
	// GresDetail has one entry per node of Nodes, in its order: the
	// job's gres_detail_str, which scontrol prints as "Nodes=n1 ...
	// GRES=nic:2(IDX:3-4),gpu:1(IDX:1)".
	GresDetail []string `json:"gres_detail"`
	// MemoryPerNode and MemoryPerCPU are the job's pn_min_memory in MiB,
	// which scontrol prints as MinMemoryNode and MinMemoryCPU: at most
	// one is set (Slurm's MEM_PER_CPU flag picks which).
	MemoryPerNode slurmNumber `json:"memory_per_node"`
	MemoryPerCPU  slurmNumber `json:"memory_per_cpu"`
}

// slurmNumber is an unsigned number of Slurm's JSON: a plain number or
// null (unset) in openapi v0.0.38 (Slurm 22.05), an object {"set": bool,
// "infinite": bool, "number": n} in the data_parser of 23.02 and later.
// An infinite or unset number reads as unset.
type slurmNumber struct {
	N   uint64
	Set bool
}

// UnmarshalJSON reads either form; anything else (a string, a negative or
// fractional number) is an error, so a field of another shape is never
// taken for a size.
func (n *slurmNumber) UnmarshalJSON(b []byte) error {
	*n = slurmNumber{}
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			Set      bool    `json:"set"`
			Infinite bool    `json:"infinite"`
			Number   *uint64 `json:"number"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		if o.Set && !o.Infinite && o.Number != nil {
			*n = slurmNumber{N: *o.Number, Set: true}
		}
		return nil
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("%s is not an unsigned integer", b)
	}
	*n = slurmNumber{N: v, Set: true}
	return nil
}

// findJob decodes `squeue --json` output and returns the record of job.
//
// It reads JSON, not `scontrol show job -d`, because scontrol prints the
// job's own strings (JobName, MCS_label, Comment, WorkDir, Network ...)
// verbatim, newlines included, before and after its detail lines: Slurm
// 22.05 accepts a job name of "vm\n   JOB_GRES=nic:8\n     Nodes=n1
// GRES=nic:8(IDX:0-7)" or "vm\n   MinMemoryNode=999G", and no line of
// that text can be told from the real one (issue 23). In JSON each such
// string is one quoted value. Slurm 22.05's squeue ignores --jobs with
// --json and lists every job, so the job is picked here by its ID.
func findJob(out []byte, job string) (*squeueJob, error) {
	id, err := strconv.ParseUint(job, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("job ID %q (SLURM_JOB_ID) is not a number", job)
	}
	var q squeueJobs
	if err := json.Unmarshal(out, &q); err != nil {
		return nil, fmt.Errorf("not squeue's JSON (Slurm 21.08 or later, with its serializer/json plugin): %w", err)
	}
	found := -1
	for i, j := range q.Jobs {
		if j.JobID != id {
			continue
		}
		if found >= 0 {
			return nil, fmt.Errorf("job %d is listed twice", id)
		}
		found = i
	}
	if found < 0 {
		return nil, fmt.Errorf("job %d is not in squeue's list (has it ended?)", id)
	}
	return &q.Jobs[found], nil
}

// JobGRESIndices parses `squeue --json` output for the indices of GRES
// name that job holds on node: the job's gres_detail entry for that node,
// such as "nic:2(IDX:3-4),gpu:1(IDX:1)". A job with none of that GRES on
// the node yields an error saying so. See findJob for why JSON.
func JobGRESIndices(out []byte, job, node, name string) ([]int, error) {
	j, err := findJob(out, job)
	if err != nil {
		return nil, err
	}
	id := j.JobID
	nodes, err := ExpandHostlist(j.Nodes)
	if err != nil {
		return nil, fmt.Errorf("job %d: nodes %q: %w", id, j.Nodes, err)
	}
	at := -1
	for i, n := range nodes {
		if n == node {
			at = i
			break
		}
	}
	if at < 0 {
		return nil, fmt.Errorf("job %d does not run on node %s (its nodes: %q): is SLURMD_NODENAME right?", id, node, j.Nodes)
	}
	if len(j.GresDetail) == 0 {
		return nil, noGRESf("node %s has no %s in this job (the job holds no GRES)", node, name)
	}
	if len(j.GresDetail) != len(nodes) {
		return nil, fmt.Errorf("job %d: %d gres_detail entries for %d nodes (%s)", id, len(j.GresDetail), len(nodes), j.Nodes)
	}
	gres := j.GresDetail[at]
	var idx []int
	for _, item := range splitOutsideParens(gres) {
		head, list, ok := strings.Cut(item, "(IDX:")
		if !ok || strings.SplitN(head, ":", 2)[0] != name {
			continue
		}
		list = strings.TrimSuffix(list, ")")
		if list == "N/A" {
			continue
		}
		n, err := ParseIndexList(list)
		if err != nil {
			return nil, fmt.Errorf("node %s: %s: %w", node, item, err)
		}
		idx = append(idx, n...)
	}
	if len(idx) == 0 {
		return nil, noGRESf("node %s has no %s in this job (GRES=%s)", node, name, gres)
	}
	return idx, nil
}

// splitOutsideParens splits a GRES list at the commas outside parentheses
// ("nic:2(IDX:0,3),gpu:1(IDX:1)" is two items).
func splitOutsideParens(s string) []string {
	var parts []string
	depth, last := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[last:i])
				last = i + 1
			}
		}
	}
	if last < len(s) {
		parts = append(parts, s[last:])
	}
	return parts
}
