package preflight

// BAR space: the devices' BARs against the guest's address space, flat
// and behind the emulated PCIe ports.

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/pcitopo"
)

// barSpace checks that every requested device's BARs fit the guest's MMIO
// windows, placed by addrspace.Plan (on the root bus) and, with the host
// topology, by addrspace.PlanHierarchy behind the devices' PCIe ports: the
// calls the VM makes, so a layout passes here exactly when the VM accepts it. I/O BARs and SR-IOV VF BARs
// (lines 7-12, which belong to the VFs, not the PF's guest) are not placed.
// hpcvmm's own virtio devices add a few 16 KiB BARs, which the largest-first
// rule places last, in gaps the device BARs leave.
func (c *checker) barSpace() {
	c.barSpaceFlat()
	c.barSpaceBehindPorts()
}

// barSpaceBehindPorts checks the layout --topology host gives the devices:
// behind the emulated PCIe ports pcitopo plans for them, placed by
// addrspace.PlanHierarchy over Plan.Placement — what pci.Root.AssignBARs
// does in the VM — so a set that fits on the root bus but not in the
// ports' windows (each rounded to 1 MiB and aligned to its largest BAR, and
// non-prefetchable 64-bit BARs in the 32-bit window) fails here as in the VM.
// A host whose tree cannot be read gets the flat layout in the VM, which
// barSpaceFlat has checked.
func (c *checker) barSpaceBehindPorts() {
	if c.req.FlatTopology || len(c.req.PortSlots) == 0 || len(c.devs) == 0 {
		return
	}
	physBits, err := c.h.PhysAddrBits()
	if err != nil {
		return // barSpaceFlat warned
	}
	w, err := addrspace.NewWindowsPMEM(c.req.Memory, c.req.PMEMSize, uint(physBits))
	if err != nil {
		return // barSpaceFlat failed
	}
	names := make([]string, len(c.devs))
	bdfs := make([]host.BDF, len(c.devs))
	for i, rd := range c.devs {
		names[i], bdfs[i] = "gpu", rd.d.BDF
		if rd.isVF {
			names[i] = "vf"
		}
	}
	devs, links, err := pcitopo.FromHost(c.h, names, bdfs)
	if err != nil {
		return
	}
	plan, err := pcitopo.New(pcitopo.Host, devs, links, c.req.PortSlots)
	if err != nil {
		c.add("bar-space-ports", "vm", Fail, "use --topology flat", "guest PCIe topology: %v", err)
		return
	}
	bridges, behind, order := plan.Placement()
	if len(bridges) == 0 {
		return
	}
	var bars []addrspace.BAR
	for _, i := range order {
		d := c.devs[i].d
		for _, b := range d.BARs {
			if b.Index >= host.ROMIndex || b.Size == 0 {
				continue
			}
			bar := addrspace.BAR{Owner: d.BDF.String(), Index: b.Index, Kind: addrspace.Mem32, Size: powerOfTwo(b.Size),
				Prefetchable: b.Prefetchable, Behind: behind[i]}
			switch {
			case b.IO:
				bar.Kind = addrspace.IO
			case b.Mem64:
				bar.Kind = addrspace.Mem64
			}
			bars = append(bars, bar)
		}
	}
	if _, err := addrspace.PlanHierarchy(w, bridges, bars); err != nil {
		c.add("bar-space-ports", "vm", Fail, "use --topology flat, less --memory or fewer devices",
			"behind the emulated PCIe ports of --topology host (%d): %v", len(bridges), err)
		return
	}
	c.add("bar-space-ports", "vm", Pass, "", "%d BARs fit behind the emulated PCIe ports of --topology host (%d)", len(bars), len(bridges))
}

// barSpaceFlat checks the BARs on the guest's root bus.
func (c *checker) barSpaceFlat() {
	if len(c.devs) == 0 {
		return
	}
	var b64, b32 []addrspace.BAR
	var total64 uint64
	for _, rd := range c.devs {
		for _, b := range rd.d.BARs {
			if b.IO || b.Index >= host.ROMIndex || b.Size == 0 {
				continue
			}
			bar := addrspace.BAR{Owner: rd.d.BDF.String(), Index: b.Index, Kind: addrspace.Mem32, Size: powerOfTwo(b.Size)}
			if b.Mem64 {
				bar.Kind = addrspace.Mem64
				b64 = append(b64, bar)
				total64 += bar.Size
			} else {
				b32 = append(b32, bar)
			}
		}
	}
	if len(b32) > 0 {
		w := addrspace.Windows{Mem32: addrspace.Range{GPA: addrspace.Window32Base, Size: addrspace.Window32Size}}
		addrs, err := addrspace.Plan(w, b32)
		var pe *addrspace.PlanError
		switch {
		case errors.As(err, &pe):
			c.add("bar-space-32bit", "vm", Fail, "pass fewer devices with 32-bit BARs",
				"%d 32-bit BARs need %s of the 32-bit MMIO window, which has %s", len(b32), guestmem.FormatSizeApprox(pe.Need), guestmem.FormatSizeApprox(w.Mem32.Size))
		case err != nil:
			c.add("bar-space-32bit", "vm", Fail, "", "%v", err)
		default:
			c.add("bar-space-32bit", "vm", Pass, "", "%d 32-bit BARs fit in [%#x, %#x)", len(b32), w.Mem32.GPA, barsEnd(b32, addrs))
		}
	}
	physBits, err := c.h.PhysAddrBits()
	if err != nil {
		c.add("bar-space", "vm", Warn, "", "cannot check 64-bit BARs against the address width: %v", err)
		return
	}
	if len(b64) == 0 {
		c.add("bar-space", "vm", Pass, "", "no 64-bit BARs")
		return
	}
	w, err := addrspace.NewWindowsPMEM(c.req.Memory, c.req.PMEMSize, uint(physBits))
	if err != nil {
		c.add("bar-space", "vm", Fail, "use less --memory", "%v", err)
		return
	}
	addrs, err := addrspace.Plan(w, b64)
	if err == nil {
		end := barsEnd(b64, addrs)
		c.add("bar-space", "vm", Pass, "", "%d 64-bit BARs (%s) fit in [%#x, %#x): need %d of the host's %d physical address bits",
			len(b64), guestmem.FormatSizeApprox(total64), w.Mem64.GPA, end, bits.Len64(end-1), physBits)
		return
	}
	var pe *addrspace.PlanError
	if !errors.As(err, &pe) {
		c.add("bar-space", "vm", Fail, "", "%v", err)
		return
	}
	end := w.Mem64.GPA + pe.Need
	fix := "pass fewer devices: these BARs do not fit below 2^" + fmt.Sprint(physBits) + " even with no RAM above 4 GiB"
	if maxMem, ok := maxMemoryFitting(b64, c.req.PMEMSize, uint(physBits)); ok {
		fix = fmt.Sprintf("use --memory %s or less, or pass fewer devices (the CPU's %d-bit physical address width is fixed)", guestmem.FormatSize(maxMem), physBits)
	}
	c.add("bar-space", "vm", Fail, fix, "%d 64-bit BARs (%s) from %#x end at %#x: the guest needs %d physical address bits, the host has %d",
		len(b64), guestmem.FormatSizeApprox(total64), w.Mem64.GPA, end, bits.Len64(end-1), physBits)
}

// powerOfTwo rounds a BAR size up to a power of two, as BAR sizing does.
func powerOfTwo(size uint64) uint64 {
	if size&(size-1) == 0 || bits.Len64(size) >= 64 {
		return size
	}
	return 1 << bits.Len64(size)
}

// barsEnd returns the end of the highest placed BAR.
func barsEnd(bars []addrspace.BAR, addrs []uint64) uint64 {
	var end uint64
	for i, b := range bars {
		end = max(end, addrs[i]+b.Size)
	}
	return end
}

// maxMemoryFitting returns the largest whole-GiB guest memory for which the
// 64-bit BARs still fit the 64-bit window, above an image of image bytes.
func maxMemoryFitting(bars []addrspace.BAR, image uint64, physBits uint) (uint64, bool) {
	fits := func(gib uint64) bool {
		w, err := addrspace.NewWindowsPMEM(gib<<30, image, physBits)
		if err != nil {
			return false
		}
		_, err = addrspace.Plan(w, bars)
		return err == nil
	}
	if !fits(0) {
		return 0, false
	}
	lo, hi := uint64(0), uint64(1)<<(physBits-30) // fits(lo) holds; find the last fitting GiB count
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo << 30, true
}
