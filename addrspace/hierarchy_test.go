package addrspace_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
)

// windowFor returns the window of br that holds BAR b, as a bridge forwards it.
func windowFor(l addrspace.Layout, br *addrspace.Bridge, b addrspace.BAR) addrspace.Range {
	w := l.Windows[br]
	switch {
	case b.Kind == addrspace.IO:
		return w.IO
	case b.Kind == addrspace.Mem64 && b.Prefetchable:
		return w.Pref
	}
	return w.Mem
}

func inside(r addrspace.Range, at, size uint64) bool {
	return r.Size != 0 && at >= r.GPA && at+size <= r.End() && at+size > at
}

// checkLayout asserts what the guest kernel checks when it claims firmware's
// assignments (and what a real bridge needs to forward): every BAR naturally
// aligned, inside its root window or inside the right window of every bridge
// above it; every bridge window on its granularity and inside the same-kind
// window of its parent; no two BARs and no two sibling windows overlapping.
func checkLayout(t *testing.T, w addrspace.Windows, bridges []*addrspace.Bridge, bars []addrspace.BAR, l addrspace.Layout) {
	t.Helper()
	require.Len(t, l.BARs, len(bars))
	for i, b := range bars {
		a := l.BARs[i]
		require.Zero(t, a%b.Size, "%s BAR%d at %#x not aligned to %#x", b.Owner, b.Index, a, b.Size)
		if b.Kind != addrspace.IO {
			require.Zero(t, a%4096, "%s BAR%d at %#x shares a page", b.Owner, b.Index, a)
		}
		if b.Behind == nil {
			r := map[addrspace.BARKind]addrspace.Range{addrspace.Mem32: w.Mem32, addrspace.Mem64: w.Mem64, addrspace.IO: w.IO}[b.Kind]
			require.True(t, inside(r, a, b.Size), "%s BAR%d [%#x+%#x) outside root window %s", b.Owner, b.Index, a, b.Size, r)
		}
		for br := b.Behind; br != nil; br = br.Parent {
			r := windowFor(l, br, b)
			require.True(t, inside(r, a, b.Size), "%s BAR%d [%#x+%#x) outside bridge %s window %s", b.Owner, b.Index, a, b.Size, br.Name, r)
		}
		if b.Kind == addrspace.Mem64 && b.Prefetchable && b.Behind != nil {
			require.True(t, inside(w.Mem64, a, b.Size), "prefetchable 64-bit BAR below a bridge belongs above RAM")
		}
		if b.Behind != nil && !(b.Kind == addrspace.Mem64 && b.Prefetchable) && b.Kind != addrspace.IO {
			require.True(t, inside(w.Mem32, a, b.Size), "non-prefetchable window is 32-bit")
		}
		for j := range i {
			o := bars[j]
			if (o.Kind == addrspace.IO) == (b.Kind == addrspace.IO) {
				require.True(t, a+b.Size <= l.BARs[j] || l.BARs[j]+o.Size <= a, "BARs %s/%d and %s/%d overlap", b.Owner, b.Index, o.Owner, o.Index)
			}
		}
	}
	type win struct {
		br   *addrspace.Bridge
		kind int
		r    addrspace.Range
	}
	var wins []win
	for _, br := range bridges {
		bw := l.Windows[br]
		for k, r := range []addrspace.Range{bw.IO, bw.Mem, bw.Pref} {
			if r.Size == 0 {
				continue
			}
			g := uint64(addrspace.MemWindowGranularity)
			if k == 0 {
				g = addrspace.IOWindowGranularity
			}
			require.Zero(t, r.GPA%g, "bridge %s window %s base", br.Name, r)
			require.Zero(t, r.Size%g, "bridge %s window %s size", br.Name, r)
			if br.Parent != nil {
				pw := l.Windows[br.Parent]
				pr := []addrspace.Range{pw.IO, pw.Mem, pw.Pref}[k]
				require.True(t, inside(pr, r.GPA, r.Size), "bridge %s window %s outside parent %s's %s", br.Name, r, br.Parent.Name, pr)
			} else {
				root := []addrspace.Range{w.IO, w.Mem32, w.Mem64}[k]
				require.True(t, inside(root, r.GPA, r.Size), "bridge %s window %s outside root window %s", br.Name, r, root)
			}
			wins = append(wins, win{br, k, r})
		}
	}
	for i, a := range wins {
		for _, b := range wins[:i] {
			if a.br.Parent == b.br.Parent && (a.kind == 0) == (b.kind == 0) {
				require.True(t, a.r.End() <= b.r.GPA || b.r.End() <= a.r.GPA, "sibling windows %s %s and %s %s overlap", a.br.Name, a.r, b.br.Name, b.r)
			}
		}
	}
}

func TestPlanHierarchyGPUAndNICBehindSwitch(t *testing.T) {
	w, err := addrspace.NewWindows(16*gib, 46)
	require.NoError(t, err)
	rp := &addrspace.Bridge{Name: "rp"}
	usp := &addrspace.Bridge{Name: "usp", Parent: rp}
	dsp1 := &addrspace.Bridge{Name: "dsp1", Parent: usp}
	dsp2 := &addrspace.Bridge{Name: "dsp2", Parent: usp}
	rp2 := &addrspace.Bridge{Name: "rp2"}
	bridges := []*addrspace.Bridge{rp, usp, dsp1, dsp2, rp2}
	bars := []addrspace.BAR{
		{Owner: "virtio", Index: 4, Kind: addrspace.Mem64, Size: 16 << 10}, // root bus
		{Owner: "gpu", Index: 0, Kind: addrspace.Mem32, Size: 16 * mib, Behind: dsp1},
		{Owner: "gpu", Index: 1, Kind: addrspace.Mem64, Prefetchable: true, Size: 128 * gib, Behind: dsp1},
		{Owner: "gpu", Index: 3, Kind: addrspace.Mem64, Prefetchable: true, Size: 32 * mib, Behind: dsp1},
		{Owner: "vf", Index: 0, Kind: addrspace.Mem64, Prefetchable: true, Size: 32 * mib, Behind: dsp2},
		{Owner: "nvme", Index: 0, Kind: addrspace.Mem64, Size: 16 << 10, Behind: dsp2}, // non-prefetchable 64-bit: 32-bit window
		{Owner: "edu", Index: 0, Kind: addrspace.Mem32, Size: mib, Behind: rp2},
		{Owner: "old", Index: 2, Kind: addrspace.IO, Size: 32, Behind: rp2},
	}
	l, err := addrspace.PlanHierarchy(w, bridges, bars)
	require.NoError(t, err)
	checkLayout(t, w, bridges, bars, l)

	// The 128 GiB BAR and its 32 MiB sibling need a 128 GiB + 32 MiB window
	// (1 MiB granularity) aligned to 128 GiB; the VF's 32 MiB joins it in
	// the upstream port's window.
	assert.Equal(t, 128*gib+32*mib, l.Windows[dsp1].Pref.Size)
	assert.Zero(t, l.Windows[dsp1].Pref.GPA%(128*gib))
	assert.Equal(t, 128*gib+64*mib, l.Windows[usp].Pref.Size)
	assert.Equal(t, l.Windows[usp].Pref, l.Windows[rp].Pref, "a root port above one switch forwards the same range")
	assert.Equal(t, 16*mib, l.Windows[dsp1].Mem.Size, "exactly the 16 MiB BAR")
	assert.Equal(t, mib, l.Windows[dsp2].Mem.Size, "a 16 KiB BAR still takes a 1 MiB window")
	assert.Equal(t, uint64(0x1000), l.Windows[rp2].IO.Size, "I/O windows are 4 KiB")
	assert.Zero(t, l.Windows[rp].IO.Size, "no I/O below the switch: window closed")
	assert.Zero(t, l.Windows[rp2].Pref.Size)
}

func TestPlanHierarchyMatchesPlanWithoutBridges(t *testing.T) {
	w, err := addrspace.NewWindows(gib, 39)
	require.NoError(t, err)
	bars := []addrspace.BAR{
		{Owner: "gpu", Index: 0, Kind: addrspace.Mem32, Size: 16 * mib},
		{Owner: "gpu", Index: 1, Kind: addrspace.Mem64, Size: 128 * gib},
		{Owner: "nic", Index: 0, Kind: addrspace.Mem64, Size: 256 * gib},
		{Owner: "nic", Index: 2, Kind: addrspace.IO, Size: 32},
		{Owner: "gpu", Index: 3, Kind: addrspace.Mem64, Size: 64 * mib},
		{Owner: "x", Index: 0, Kind: addrspace.Mem32, Size: 1024},
		{Owner: "y", Index: 0, Kind: addrspace.Mem32, Size: 2048},
	}
	want, err := addrspace.Plan(w, bars)
	require.NoError(t, err)
	l, err := addrspace.PlanHierarchy(w, nil, bars)
	require.NoError(t, err)
	assert.Equal(t, want, l.BARs)
}

func TestPlanHierarchyErrors(t *testing.T) {
	w, err := addrspace.NewWindows(gib, 39)
	require.NoError(t, err)
	stray := &addrspace.Bridge{Name: "stray"}
	_, err = addrspace.PlanHierarchy(w, nil, []addrspace.BAR{{Owner: "a", Kind: addrspace.Mem32, Size: 4096, Behind: stray}})
	assert.ErrorContains(t, err, "not in the bridge list")
	a := &addrspace.Bridge{Name: "a"}
	b := &addrspace.Bridge{Name: "b", Parent: a}
	a.Parent = b
	_, err = addrspace.PlanHierarchy(w, []*addrspace.Bridge{a, b}, nil)
	assert.ErrorContains(t, err, "cycle")

	// Two root ports each needing a 1 MiB window for a 4 KiB BAR: 513 of
	// them cannot fit the 512 MiB 32-bit window.
	var bridges []*addrspace.Bridge
	var bars []addrspace.BAR
	for i := range 513 {
		br := &addrspace.Bridge{Name: "rp"}
		bridges = append(bridges, br)
		bars = append(bars, addrspace.BAR{Owner: "d", Index: i, Kind: addrspace.Mem32, Size: 4096, Behind: br})
	}
	_, err = addrspace.PlanHierarchy(w, bridges, bars)
	assert.ErrorContains(t, err, "need 0x20100000 bytes")

	// A 512 GiB BAR behind a port does not fit a 39-bit guest.
	rp := &addrspace.Bridge{Name: "rp"}
	_, err = addrspace.PlanHierarchy(w, []*addrspace.Bridge{rp}, []addrspace.BAR{{Owner: "g", Kind: addrspace.Mem64, Prefetchable: true, Size: 512 * gib, Behind: rp}})
	assert.ErrorContains(t, err, "prefetchable window")
}

// FuzzPlanHierarchy builds arbitrary bridge trees with arbitrary BARs and
// asserts checkLayout's properties on every layout PlanHierarchy accepts,
// and that with no bridges it places exactly as Plan does.
func FuzzPlanHierarchy(f *testing.F) {
	f.Add(uint8(46), []byte{0, 1, 2, 2, 0}, []byte{1, 30, 2, 37, 3, 22, 4, 12, 5, 2, 0, 14})
	f.Add(uint8(39), []byte{}, []byte{0, 20, 0, 37, 0, 2})
	f.Fuzz(func(t *testing.T, physBits uint8, tree []byte, barBytes []byte) {
		w, err := addrspace.NewWindows(4*gib, uint(physBits%20)+33)
		if err != nil {
			return
		}
		if len(tree) > 16 {
			tree = tree[:16]
		}
		// tree[i] picks bridge i's parent among the bridges before it (0: root bus).
		var bridges []*addrspace.Bridge
		for i, p := range tree {
			br := &addrspace.Bridge{Name: string(rune('A' + i))}
			if n := int(p) % (i + 1); n > 0 {
				br.Parent = bridges[n-1]
			}
			bridges = append(bridges, br)
		}
		var bars []addrspace.BAR
		for i := 0; i+1 < len(barBytes) && len(bars) < 24; i += 2 {
			sel, s := barBytes[i], barBytes[i+1]
			b := addrspace.BAR{Owner: "d", Index: i / 2, Kind: addrspace.BARKind(s % 3), Prefetchable: s&0x80 != 0}
			b.Size = 1 << (2 + (s>>2)%40)
			if b.Kind == addrspace.Mem32 && b.Size > 1<<31 {
				b.Size = 1 << 31
			}
			if b.Kind == addrspace.IO && b.Size > 256 {
				b.Size = 256
			}
			if n := int(sel) % (len(bridges) + 1); n > 0 {
				b.Behind = bridges[n-1]
			}
			bars = append(bars, b)
		}
		l, err := addrspace.PlanHierarchy(w, bridges, bars)
		if len(bridges) == 0 {
			flat, ferr := addrspace.Plan(w, bars)
			require.Equal(t, ferr == nil, err == nil, "Plan: %v, PlanHierarchy: %v", ferr, err)
			if err == nil {
				require.Equal(t, flat, l.BARs)
			}
		}
		if err != nil {
			return
		}
		checkLayout(t, w, bridges, bars, l)
	})
}
