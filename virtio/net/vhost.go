package net

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/vmm/pci"
)

// vhost-net's vring indices within one instance.
const (
	vhostRx = 0
	vhostTx = 1
)

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
// instance. From here until Reset the kernel owns those rings.
func (d *Device) startVhost(features uint64, queues []*queue.Queue) error {
	fds := d.backend.QueueFDs()
	for i := 0; i < d.pairs; i++ {
		rxq, txq := queues[2*i], queues[2*i+1]
		if rxq == nil || txq == nil {
			continue
		}
		v, err := uapi.OpenVhostNet()
		if err != nil {
			return fmt.Errorf("virtio-net %s pair %d: %w", d.opts.Name, i, err)
		}
		d.vhosts = append(d.vhosts, v)
		if err := d.setupVhost(v, features, [2]*queue.Queue{rxq, txq}, 2*i, fds[i]); err != nil {
			return fmt.Errorf("virtio-net %s pair %d: %w", d.opts.Name, i, err)
		}
	}
	return nil
}

func (d *Device) setupVhost(v *uapi.VhostNet, features uint64, qs [2]*queue.Queue, first, tap int) error {
	if err := v.SetOwner(); err != nil {
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
		if err := pci.SignalEventFD(d.fds[first+r].Kick); err != nil {
			return fmt.Errorf("vring %d: initial kick: %w", r, err)
		}
	}
	return nil
}
