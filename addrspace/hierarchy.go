package addrspace

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// Bridge window granularity, fixed by the type-1 header: memory windows
// (base/limit registers hold address bits 31:20) start and end on 1 MiB
// boundaries, I/O windows (bits 15:12) on 4 KiB ones.
const (
	MemWindowGranularity = 1 << 20
	IOWindowGranularity  = 4 << 10
)

// Bridge is a PCI-to-PCI bridge (a PCIe root port, switch upstream or
// downstream port) in the placement tree: devices whose BARs name it in
// BAR.Behind sit on its secondary side, and bridges whose Parent is it are
// nested below it. A nil Parent is the root bus.
type Bridge struct {
	Name   string
	Parent *Bridge
}

// BridgeWindows are the three forwarding windows of one bridge. A window
// with Size 0 is closed (nothing below needs it).
type BridgeWindows struct {
	// IO is the I/O window (4 KiB granularity).
	IO Range
	// Mem is the 32-bit non-prefetchable memory window (1 MiB granularity):
	// every memory BAR below except 64-bit prefetchable ones.
	Mem Range
	// Pref is the 64-bit prefetchable window (1 MiB granularity): 64-bit
	// prefetchable BARs, such as GPU frame buffers of 128 GiB and more.
	Pref Range
}

// Layout is PlanHierarchy's result.
type Layout struct {
	// BARs holds the address of each input BAR, in input order.
	BARs []uint64
	// Windows holds each bridge's windows.
	Windows map[*Bridge]BridgeWindows
}

// windowClass is where a BAR or a child window goes behind a bridge.
type windowClass uint8

const (
	classIO windowClass = iota
	classMem
	classPref
	numClasses
)

// item is one thing to place in a window: a BAR or a child bridge's window.
type item struct {
	size, align uint64
	bar         int     // index into the BAR list, or -1
	bridge      *Bridge // the child bridge whose window this is, with class
	class       windowClass
	order       int    // stable tie-break: input order of BARs, then bridges
	offset      uint64 // relative to the parent window's base, once placed
}

// sizedBridge is a bridge's computed window sizes and its placed items.
type sizedBridge struct {
	size, align [numClasses]uint64
	items       [numClasses][]*item
}

func classOf(b BAR) windowClass {
	switch {
	case b.Kind == IO:
		return classIO
	case b.Kind == Mem64 && b.Prefetchable:
		return classPref
	}
	return classMem
}

func granularity(c windowClass) uint64 {
	if c == classIO {
		return IOWindowGranularity
	}
	return MemWindowGranularity
}

// sortItems orders items the way Plan orders BARs: largest alignment first,
// then largest size, then input order, so natural alignment wastes least
// and the result does not depend on map iteration.
func sortItems(items []*item) {
	slices.SortStableFunc(items, func(a, b *item) int {
		if c := cmp.Compare(b.align, a.align); c != 0 {
			return c
		}
		if c := cmp.Compare(b.size, a.size); c != 0 {
			return c
		}
		return cmp.Compare(a.order, b.order)
	})
}

// PlanHierarchy places BARs of devices on the root bus and behind bridges,
// as firmware does before an OS that keeps its assignments: each bridge's
// windows are sized bottom-up to hold its BARs and its child bridges'
// windows (rounded up to the window granularity, aligned to the largest
// alignment inside), then placed top-down. BARs on the root bus go in w's
// windows exactly as Plan places them; behind a bridge, a 64-bit
// prefetchable BAR goes in the bridge's prefetchable window, any other
// memory BAR in its 32-bit memory window (a non-prefetchable window is
// 32-bit by definition of the type-1 header) and an I/O BAR in its I/O
// window. A top-level bridge's memory window comes from w.Mem32, its
// prefetchable window from w.Mem64, its I/O window from w.IO.
//
// Every BAR.Behind and Bridge.Parent must be nil or listed in bridges. The
// result depends only on the tree and the input order, so the VM and
// preflight, walking the same tree in the same order, get the same layout.
func PlanHierarchy(w Windows, bridges []*Bridge, bars []BAR) (Layout, error) {
	if err := validateHierarchy(bridges, bars); err != nil {
		return Layout{}, err
	}
	t := newTree(bridges, bars)
	sized, err := t.size(bars)
	if err != nil {
		return Layout{}, err
	}
	return t.place(w, bridges, bars, sized)
}

// validateHierarchy checks PlanHierarchy's input: bridges listed once, not
// nil, their parents listed and acyclic, every BAR behind a listed bridge
// (or the root bus) with a power-of-two size.
func validateHierarchy(bridges []*Bridge, bars []BAR) error {
	known := make(map[*Bridge]int, len(bridges))
	for i, b := range bridges {
		if b == nil {
			return fmt.Errorf("addrspace: bridge %d is nil", i)
		}
		if _, dup := known[b]; dup {
			return fmt.Errorf("addrspace: bridge %s listed twice", b.Name)
		}
		known[b] = i
	}
	for _, b := range bridges {
		depth := 0
		for p := b.Parent; p != nil; p = p.Parent {
			if _, ok := known[p]; !ok {
				return fmt.Errorf("addrspace: bridge %s: parent %s is not in the bridge list", b.Name, p.Name)
			}
			if depth++; depth > len(bridges) {
				return fmt.Errorf("addrspace: bridge %s: parents form a cycle", b.Name)
			}
		}
	}
	for _, b := range bars {
		if b.Behind != nil {
			if _, ok := known[b.Behind]; !ok {
				return fmt.Errorf("addrspace: %s BAR%d: bridge %s is not in the bridge list", b.Owner, b.Index, b.Behind.Name)
			}
		}
		if bits.OnesCount64(b.Size) != 1 {
			return fmt.Errorf("addrspace: %s BAR%d: size %#x is not a power of two", b.Owner, b.Index, b.Size)
		}
	}

	return nil
}

// tree is the hierarchy's children: of each bridge (nil: the root bus),
// in input order.
type tree struct {
	childBridges map[*Bridge][]*Bridge
	childBARs    map[*Bridge][]int // indices into bars
}

func newTree(bridges []*Bridge, bars []BAR) tree {
	childBridges := map[*Bridge][]*Bridge{}
	for _, b := range bridges {
		childBridges[b.Parent] = append(childBridges[b.Parent], b)
	}
	childBARs := map[*Bridge][]int{}
	for i, b := range bars {
		childBARs[b.Behind] = append(childBARs[b.Behind], i)
	}

	return tree{childBridges: childBridges, childBARs: childBARs}
}

// size sizes every bridge's windows bottom-up, children before parents (a
// post-order walk): each window holds its BARs and its child bridges'
// windows of that class, placed as the parent will place them, rounded to
// the window granularity.
func (t tree) size(bars []BAR) (map[*Bridge]*sizedBridge, error) {
	childBridges, childBARs := t.childBridges, t.childBARs
	sized := map[*Bridge]*sizedBridge{}
	var size func(b *Bridge) error
	size = func(b *Bridge) error {
		sb := &sizedBridge{}
		order := 0
		for _, i := range childBARs[b] {
			c := classOf(bars[i])
			minAlign := uint64(minMMIOAlign)
			if c == classIO {
				minAlign = 4
			}
			sb.items[c] = append(sb.items[c], &item{size: bars[i].Size, align: max(bars[i].Size, minAlign), bar: i, class: c, order: order})
			order++
		}
		for _, cb := range childBridges[b] {
			if err := size(cb); err != nil {
				return err
			}
			cs := sized[cb]
			for c := range numClasses {
				if cs.size[c] != 0 {
					sb.items[c] = append(sb.items[c], &item{size: cs.size[c], align: cs.align[c], bar: -1, bridge: cb, class: c, order: order})
					order++
				}
			}
		}
		for c := range numClasses {
			if len(sb.items[c]) == 0 {
				continue
			}
			sortItems(sb.items[c])
			g := granularity(c)
			a := &Allocator{name: b.Name + " window", window: Range{GPA: 0, Size: ^uint64(0)}, minAlign: 4}
			align := g
			for _, it := range sb.items[c] {
				off, err := a.AllocAligned(it.size, it.align)
				if err != nil {
					return fmt.Errorf("addrspace: bridge %s: %w", b.Name, err)
				}
				it.offset = off
				align = max(align, it.align)
			}
			end := a.End()
			if end > ^uint64(0)-g {
				return fmt.Errorf("addrspace: bridge %s: windows exceed the address space", b.Name)
			}
			sb.size[c] = AlignUp(end, g)
			sb.align[c] = align
		}
		sized[b] = sb
		return nil
	}
	for _, b := range childBridges[nil] {
		if err := size(b); err != nil {
			return nil, err
		}
	}

	return sized, nil
}

// place places top-down: the root bus's BARs by their own kind and the
// top bridges' windows by class in the guest's windows, largest first, and
// each window's contents at the offsets sizing gave them.
func (t tree) place(w Windows, bridges []*Bridge, bars []BAR, sized map[*Bridge]*sizedBridge) (Layout, error) {
	childBridges, childBARs := t.childBridges, t.childBARs
	roots := map[BARKind]Range{Mem32: w.Mem32, Mem64: w.Mem64, IO: w.IO}
	var top []*item
	order := 0
	for _, i := range childBARs[nil] {
		minAlign := uint64(minMMIOAlign)
		if bars[i].Kind == IO {
			minAlign = 4
		}
		top = append(top, &item{size: bars[i].Size, align: max(bars[i].Size, minAlign), bar: i, order: order})
		order++
	}
	for _, b := range childBridges[nil] {
		for c := range numClasses {
			if sized[b].size[c] != 0 {
				top = append(top, &item{size: sized[b].size[c], align: sized[b].align[c], bar: -1, bridge: b, class: c, order: order})
				order++
			}
		}
	}
	sortItems(top)
	allocs := map[BARKind]*Allocator{}
	for kind, r := range roots {
		if r.Size == 0 {
			continue
		}
		a, err := NewAllocator(kind.String()+" window", r, kind == IO)
		if err != nil {
			return Layout{}, err
		}
		allocs[kind] = a
	}
	out := Layout{BARs: make([]uint64, len(bars)), Windows: make(map[*Bridge]BridgeWindows, len(bridges))}
	for _, b := range bridges {
		out.Windows[b] = BridgeWindows{}
	}
	var place func(it *item, base uint64)
	place = func(it *item, base uint64) {
		if it.bar >= 0 {
			out.BARs[it.bar] = base
			return
		}
		bw := out.Windows[it.bridge]
		r := Range{GPA: base, Size: it.size}
		switch it.class {
		case classIO:
			bw.IO = r
		case classMem:
			bw.Mem = r
		case classPref:
			bw.Pref = r
		}
		out.Windows[it.bridge] = bw
		for _, child := range sized[it.bridge].items[it.class] {
			place(child, base+child.offset)
		}
	}
	for _, it := range top {
		kind := Mem32
		switch {
		case it.bar >= 0:
			kind = bars[it.bar].Kind
		case it.class == classIO:
			kind = IO
		case it.class == classPref:
			kind = Mem64
		}
		a := allocs[kind]
		name := ""
		if it.bar >= 0 {
			name = fmt.Sprintf("%s BAR%d", bars[it.bar].Owner, bars[it.bar].Index)
		} else {
			name = fmt.Sprintf("bridge %s %s window", it.bridge.Name, []string{"I/O", "memory", "prefetchable"}[it.class])
		}
		if a == nil {
			return Layout{}, fmt.Errorf("addrspace: %s (%#x bytes): the guest has no %s window", name, it.size, kind)
		}
		at, err := a.AllocAligned(it.size, it.align)
		if err != nil {
			if it.bar >= 0 {
				return Layout{}, &PlanError{BAR: bars[it.bar], Window: a.window, Need: needItems(a.window.GPA, top, kind, bars)}
			}
			return Layout{}, fmt.Errorf("addrspace: %s (%#x bytes, aligned to %#x) does not fit the %s window %s: the %s BARs and windows need %#x bytes of it",
				name, it.size, it.align, kind, a.window, kind, needItems(a.window.GPA, top, kind, bars))
		}
		place(it, at)
	}
	return out, nil
}

// needItems returns how many bytes from start the root-bus items of kind
// take when placed with no upper limit.
func needItems(start uint64, top []*item, kind BARKind, bars []BAR) uint64 {
	a := &Allocator{name: "unbounded", window: Range{GPA: start, Size: ^uint64(0) - start}, minAlign: minMMIOAlign}
	if kind == IO {
		a.minAlign = 4
	}
	for _, it := range top {
		k := Mem32
		switch {
		case it.bar >= 0:
			k = bars[it.bar].Kind
		case it.class == classIO:
			k = IO
		case it.class == classPref:
			k = Mem64
		}
		if k != kind {
			continue
		}
		if _, err := a.AllocAligned(it.size, it.align); err != nil {
			return 0
		}
	}
	return a.End() - start
}
