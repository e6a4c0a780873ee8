package net

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// vhost-net's vring indices within one instance.
const (
	vhostRx = 0
	vhostTx = 1
)

// vhostNet is what the device uses of a vhost-net instance
// (*uapi.VhostNet); tests substitute a recorder.
type vhostNet interface {
	SetOwner() error
	SetFeatures(f uint64) error
	SetMemTable(regions []uapi.VhostRegion) error
	SetVringNum(index, num uint32) error
	SetVringBase(index, base uint32) error
	SetVringAddr(index uint32, desc, avail, used []byte) error
	SetVringKick(index uint32, fd int) error
	SetVringCall(index uint32, fd int) error
	SetBackend(index uint32, fd int) error
	Close() error
}

func openVhostNet() (vhostNet, error) {
	v, err := uapi.OpenVhostNet()
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return v, nil
}

// probeVhost checks that vhost-net can serve this device: the options it
// needs are there and the kernel offers every ring feature the transport
// offers, so any negotiation result is one vhost accepts.
func probeVhost(opts Options) error {
	if opts.Memory == nil || len(opts.Regions) == 0 {
		return errors.New("vhost-net needs guest memory regions")
	}
	v, err := uapi.OpenVhostNet()
	if err != nil {
		return err
	}
	defer v.Close()
	if err := v.SetOwner(); err != nil {
		return err
	}
	f, err := v.Features()
	if err != nil {
		return err
	}
	if f&vhostFeatures != vhostFeatures {
		return fmt.Errorf("vhost-net offers features %#x, lacking %#x", f, vhostFeatures&^f)
	}
	return nil
}

// startVhost gives each pair with both queues enabled to its own vhost-net
// instance (d.vhosts[i], nil for a pair left out). From here until Reset
// the kernel owns those rings.
func (d *Device) startVhost(features uint64, queues []*queue.Queue) error {
	fds := d.backend.QueueFDs()
	open := d.openVhost
	if open == nil {
		open = openVhostNet
	}
	d.vhosts = make([]vhostNet, d.pairs)
	for i := 0; i < d.pairs; i++ {
		rxq, txq := queues[2*i], queues[2*i+1]
		if rxq == nil || txq == nil {
			continue
		}
		v, err := open()
		if err != nil {
			return fmt.Errorf("virtio-net %s pair %d: %w", d.opts.Name, i, err)
		}
		d.vhosts[i] = v
		if err := d.setupVhost(v, features, [2]*queue.Queue{rxq, txq}, 2*i, fds[i]); err != nil {
			return fmt.Errorf("virtio-net %s pair %d: %w", d.opts.Name, i, err)
		}
	}
	return nil
}

// QueueCallChanged implements transport.CallFDOwner: the driver moved data
// queue q to another MSI-X vector (call is its irqfd eventfd) or to none
// (-1) after DRIVER_OK. vhost-net would otherwise keep signalling the old
// vector's eventfd, whose GSI the guest may have retargeted or freed, and
// the queue's interrupts would be lost or misdelivered. The userspace
// workers need nothing: they raise interrupts through the transport, which
// looks the vector up each time.
func (d *Device) QueueCallChanged(q int, call int) {
	if q < 0 || q >= len(d.fds) || q >= 2*d.pairs {
		return
	}
	d.fds[q].Call = call
	if !d.running || !d.vhost || q/2 >= len(d.vhosts) || d.vhosts[q/2] == nil {
		return
	}
	// VHOST_SET_VRING_CALL takes the vring's mutex: safe while the kernel
	// worker runs, and the next used-ring update signals the new eventfd.
	if err := d.vhosts[q/2].SetVringCall(uint32(q%2), call); err != nil {
		err = fmt.Errorf("virtio-net %s queue %d: new interrupt vector: %w", d.opts.Name, q, err)
		if d.fail != nil {
			d.fail(err)
		} else {
			d.report(err)
		}
	}
}

func (d *Device) setupVhost(v vhostNet, features uint64, qs [2]*queue.Queue, first, tap int) error {
	if err := d.ownVhost(v); err != nil {
		return err
	}
	if err := v.SetFeatures(features & vhostFeatures); err != nil {
		return err
	}
	if err := v.SetMemTable(d.opts.Regions); err != nil {
		return err
	}
	for r, q := range qs {
		qf := d.fds[first+r]
		size := uint64(qf.Config.Size)
		desc, err := d.opts.Memory.Slice(qf.Config.Desc, 16*size)
		if err != nil {
			return fmt.Errorf("vring %d descriptors: %w", r, err)
		}
		avail, err := d.opts.Memory.Slice(qf.Config.Driver, 6+2*size)
		if err != nil {
			return fmt.Errorf("vring %d available ring: %w", r, err)
		}
		used, err := d.opts.Memory.Slice(qf.Config.Device, 6+8*size)
		if err != nil {
			return fmt.Errorf("vring %d used ring: %w", r, err)
		}
		idx := uint32(r)
		if err := v.SetVringNum(idx, uint32(size)); err != nil {
			return err
		}
		if err := v.SetVringBase(idx, uint32(q.LastAvail())); err != nil {
			return err
		}
		if err := v.SetVringAddr(idx, desc, avail, used); err != nil {
			return err
		}
		if err := v.SetVringKick(idx, qf.Kick); err != nil {
			return err
		}
		if err := v.SetVringCall(idx, qf.Call); err != nil {
			return err
		}
	}
	for _, idx := range []uint32{vhostRx, vhostTx} {
		if err := v.SetBackend(idx, tap); err != nil {
			return err
		}
	}
	// Buffers the driver posted before DRIVER_OK were kicked into the
	// transport's eventfd already; one more kick makes vhost look at them.
	for r := range qs {
		if err := irq.SignalEventFD(d.fds[first+r].Kick); err != nil {
			return fmt.Errorf("vring %d: initial kick: %w", r, err)
		}
	}
	return nil
}

// ownVhost binds v to this process (VHOST_SET_OWNER) and moves the worker
// thread the kernel starts for it onto Options.WorkerCPUs.
//
// The kernel names the worker "vhost-<tid of the caller>" and places it
// carelessly for hpcvmm: before Linux 6.4 it is a kthread allowed on every
// CPU, which the scheduler keeps waking on the CPU of the thread that
// kicked it; from 6.4 it is a thread of this process that inherits the
// caller's affinity. The caller here is the vCPU thread that wrote
// DRIVER_OK, pinned to one CPU, and every doorbell comes from a vCPU
// thread. Either way the worker and the vCPU it serves take turns on one
// CPU, and the guest idles while its packets wait (measured in the nested
// test bed with a 16 MiB transfer each way: the worker spent 5.7 s
// waiting on a run queue for 3.3 s of running).
func (d *Device) ownVhost(v vhostNet) error {
	cpus := d.opts.WorkerCPUs
	if len(cpus) == 0 {
		return v.SetOwner()
	}
	// The worker's name carries the tid of the thread that calls
	// VHOST_SET_OWNER: stay on one thread until it is found.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	name := "vhost-" + strconv.Itoa(unix.Gettid())
	before := d.findTasks(name, nil)
	if err := v.SetOwner(); err != nil {
		return err
	}
	// Several instances set up from this thread share the name; the new
	// worker is the one that was not there before.
	workers := d.findTasks(name, before)
	if len(workers) == 0 {
		d.report(fmt.Errorf("virtio-net %s: no vhost worker thread %q found to place on CPUs %v; the kernel's placement stays", d.opts.Name, name, cpus))
		return nil
	}
	set := d.setAffinity
	if set == nil {
		set = setAffinity
	}
	for tid := range workers {
		if err := set(tid, cpus); err != nil {
			// Not fatal: a cpuset cgroup may forbid these CPUs; the data
			// path works, only slower.
			d.report(fmt.Errorf("virtio-net %s: place vhost worker %d on CPUs %v: %w", d.opts.Name, tid, cpus, err))
		}
	}
	return nil
}

// findTasks returns the ids of the tasks called name, among the system's
// kernel threads and this process's threads, leaving out those in skip.
//
// Any process can give its threads any name (prctl PR_SET_NAME), so a
// task of the system's called "vhost-<tid>" counts only if it is a kernel
// thread (PF_KTHREAD in its stat flags, which no user process can have):
// otherwise another user's process could have root hpcvmm move its threads
// onto the job's CPUs (issue 23). The kernel names a vhost kthread after
// the tid of the owner that started it, which is the calling thread here
// and unique among live tasks; a kthread left from a former owner of that
// tid is in skip. Threads in self/task are this process's own.
func (d *Device) findTasks(name string, skip map[int]bool) map[int]bool {
	root := d.procRoot
	if root == "" {
		root = "/proc"
	}
	found := map[int]bool{}
	for _, dir := range []string{root, filepath.Join(root, "self", "task")} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		own := dir != root
		for _, e := range ents {
			id, err := strconv.Atoi(e.Name())
			if err != nil || skip[id] {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
			if err != nil || strings.TrimSpace(string(b)) != name {
				continue
			}
			if own || isKernelThread(filepath.Join(dir, e.Name(), "stat")) {
				found[id] = true
			}
		}
	}
	return found
}

// pfKthread is PF_KTHREAD (include/linux/sched.h), set on kernel threads
// only.
const pfKthread = 0x00200000

// isKernelThread reports whether the task whose /proc stat file is at path
// is a kernel thread: field 9 (flags) has PF_KTHREAD. The fields after the
// name are parsed from its closing parenthesis, since a name may contain
// spaces and parentheses.
func isKernelThread(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfKthread != 0
}

func setAffinity(tid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(tid, &set)
}
