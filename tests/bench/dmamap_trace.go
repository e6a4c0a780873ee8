package main

// The DMA-map case's kernel tracing: the MAP_DMA kprobes, their trace parsed and classified against the guest RAM memfd.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The VFIO DMA-map case (issues 5 and 8): how long each VMM spends in
// VFIO_IOMMU_MAP_DMA to make its guest RAM reachable by a passed-through
// device, and in how many calls, for 1, 2 and 4 GiB of guest RAM on 1 GiB,
// 2 MiB and 4 KiB pages. hpcvmm runs `hpcvmm run --gpu BDF --memory X
// --hugepages P`; QEMU runs q35 with the same kind of memory backend
// (memfd, shared, hugetlb of the page size, preallocated) and
// `-device vfio-pci,host=BDF`. Both are stopped once their RAM is mapped:
// hpcvmm at its first KVM_RUN (it maps guest RAM while building the VM),
// QEMU when its monitor answers with the machine paused (-S), since
// vfio-pci maps every RAM section while the device is realized.
//
// The measurement is the kernel's, the same for both VMMs: a kprobe on
// vfio_iommu_type1_ioctl (filtered to VFIO_IOMMU_MAP_DMA, recording the
// struct vfio_iommu_type1_dma_map the caller passed: vaddr, iova, size,
// flags) and a kretprobe on the same function, timestamped by the trace
// clock "mono". strace was the first choice but Debian bookworm's strace
// 6.1 prints "VFIO_DEVICE_PCI_HOT_RESET or VFIO_IOMMU_MAP_DMA, 0x7ffd..."
// (the two ioctls share a number and it decodes neither struct), so it
// could not tell guest RAM from ROM or BAR mappings; it also stops the VMM
// at every traced syscall, which ftrace does not.
//
// A call maps guest RAM when [vaddr, vaddr+size) lies in a memfd mapping
// of the VMM (both back guest RAM with a memfd; nothing else they map for
// DMA is one): QEMU's ROMs (read-only) and hpcvmm's peer-to-peer BAR
// mappings are counted apart.

// vfioIOMMUMapDMA is VFIO_IOMMU_MAP_DMA, _IO(VFIO_TYPE, VFIO_BASE + 13)
// from linux/vfio.h: the kprobe filter's command number.
const vfioIOMMUMapDMA = 0x3b71

// Kprobe event names (group hpcvmm_bench, so removing them cannot touch
// anyone else's events).
const (
	kprobeGroup  = "hpcvmm_bench"
	kprobeMap    = "map_dma"
	kprobeMapRet = "map_dma_ret"
)

// kprobeDefs are the probe definitions for kprobe_events: on x86-64
// vfio_iommu_type1_ioctl(iommu_data, cmd, arg) has cmd in %si and the
// user pointer arg in %dx; +uN() reads the caller's struct
// vfio_iommu_type1_dma_map {u32 argsz, flags; u64 vaddr, iova, size}.
var kprobeDefs = []string{
	"p:" + kprobeGroup + "/" + kprobeMap + " vfio_iommu_type1_ioctl cmd=%si:x32 flags=+u4(%dx):x32 vaddr=+u8(%dx):x64 iova=+u16(%dx):x64 size=+u24(%dx):x64",
	"r:" + kprobeGroup + "/" + kprobeMapRet + " vfio_iommu_type1_ioctl ret=$retval:s64",
}

// dmaCall is one VFIO_IOMMU_MAP_DMA seen in the trace.
type dmaCall struct {
	TID               int
	Start, End        float64 // trace clock, seconds
	Vaddr, IOVA, Size uint64
	Flags             uint64
	Ret               int64
}

func (c dmaCall) ms() float64 { return (c.End - c.Start) * 1000 }

// traceLine matches an ftrace text line: "COMM-TID [CPU] FLAGS TIME: EVENT: ARGS"
// (the irq-flags column and the "(TGID)" column are optional).
var traceLine = regexp.MustCompile(`^\s*(.*?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(\d+\.\d+):\s+([\w.-]+):\s*(.*)$`)

// parseMapTrace pairs the map_dma entries of an ftrace text dump with the
// next map_dma_ret of the same thread (a thread is inside one ioctl at a
// time; returns of the other type1 ioctls, which the entry filter leaves
// out, have no open entry and are skipped). It returns the completed
// calls in entry order and describes entries that never returned.
func parseMapTrace(r io.Reader) ([]dmaCall, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	open := map[int]int{} // tid -> index in calls
	var calls []dmaCall
	var problems []string
	for sc.Scan() {
		m := traceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tid, _ := strconv.Atoi(m[2])
		ts, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		args := traceArgs(m[5])
		switch m[4] {
		case kprobeMap:
			if i, ok := open[tid]; ok {
				problems = append(problems, fmt.Sprintf("thread %d entered MAP_DMA at %.6f without returning from the one at %.6f", tid, ts, calls[i].Start))
			}
			c := dmaCall{TID: tid, Start: ts}
			var bad []string
			for _, f := range []struct {
				k string
				p *uint64
			}{{"vaddr", &c.Vaddr}, {"iova", &c.IOVA}, {"size", &c.Size}, {"flags", &c.Flags}} {
				v, err := strconv.ParseUint(args[f.k], 0, 64)
				if err != nil {
					bad = append(bad, f.k)
				}
				*f.p = v
			}
			if len(bad) > 0 {
				problems = append(problems, fmt.Sprintf("MAP_DMA entry at %.6f: unreadable %s in %q", ts, strings.Join(bad, ", "), m[5]))
				delete(open, tid)
				continue
			}
			open[tid] = len(calls)
			calls = append(calls, c)
		case kprobeMapRet:
			i, ok := open[tid]
			if !ok {
				continue
			}
			delete(open, tid)
			calls[i].End = ts
			ret, err := strconv.ParseInt(args["ret"], 0, 64)
			if err != nil {
				ret = math.MinInt64
			}
			calls[i].Ret = ret
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	done := calls[:0]
	for _, c := range calls {
		if c.End == 0 && c.Start != 0 {
			problems = append(problems, fmt.Sprintf("MAP_DMA of thread %d at %.6f (iova %#x, size %#x) has no return in the trace", c.TID, c.Start, c.IOVA, c.Size))
			continue
		}
		done = append(done, c)
	}
	if len(problems) > 0 {
		return done, errors.New(strings.Join(problems, "; "))
	}
	return done, nil
}

// traceArgs splits "k=v k=v" event arguments.
func traceArgs(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

// addrRange is one mapping of a process, [Start, End).
type addrRange struct{ Start, End uint64 }

// memfdRanges returns the memfd mappings in a /proc/PID/maps dump: guest
// RAM for both VMMs (hpcvmm "/memfd:hpcvmm-guest-ram", QEMU's
// memory-backend-memfd "/memfd:memory-backend-memfd"; " (deleted)" may
// follow).
func memfdRanges(r io.Reader) ([]addrRange, error) {
	var out []addrRange
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/memfd:") {
			continue
		}
		a, b, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(a, 16, 64)
		end, err2 := strconv.ParseUint(b, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			continue
		}
		out = append(out, addrRange{start, end})
	}
	return out, sc.Err()
}

// dmaResult is one run's MAP_DMA calls, split into guest RAM and the rest.
type dmaResult struct {
	RAM, Other []dmaCall
}

// classifyCalls splits calls into those that map guest RAM (inside one of
// the memfd ranges) and the others.
func classifyCalls(calls []dmaCall, memfds []addrRange) dmaResult {
	var r dmaResult
	for _, c := range calls {
		inRAM := false
		for _, m := range memfds {
			if c.Vaddr >= m.Start && c.Size <= m.End-c.Vaddr && c.Vaddr < m.End {
				inRAM = true
				break
			}
		}
		if inRAM {
			r.RAM = append(r.RAM, c)
		} else {
			r.Other = append(r.Other, c)
		}
	}
	return r
}

// metrics fills s from the run's calls; guestBytes is the guest RAM size,
// holeBytes what the VMM may leave unmapped (QEMU: the legacy VGA and ROM
// area below 1 MiB). Every RAM call counts, also one that maps a range
// again (QEMU unmaps and remaps a RAM section when the chipset's memory map
// changes during machine setup: that is time it spends); completeness is
// judged on the union of the IOVA ranges. Incomplete or failed mappings
// make s an error.
func (r dmaResult) metrics(s *Sample, guestBytes, holeBytes uint64) {
	var parts []string
	for _, c := range r.RAM {
		parts = append(parts, fmt.Sprintf("iova=%#x size=%#x ret=%d %.3fms", c.IOVA, c.Size, c.Ret, c.ms()))
	}
	s.Info["ram_calls"] = strings.Join(parts, "; ")
	parts = parts[:0]
	for _, c := range r.Other {
		parts = append(parts, fmt.Sprintf("iova=%#x size=%#x flags=%#x ret=%d %.3fms", c.IOVA, c.Size, c.Flags, c.Ret, c.ms()))
	}
	s.Info["other_calls"] = strings.Join(parts, "; ")

	var ms, otherMs float64
	var total uint64
	first, last := math.Inf(1), math.Inf(-1)
	spans := make([]addrRange, 0, len(r.RAM))
	for _, c := range r.RAM {
		if c.Ret != 0 {
			s.Err = fmt.Sprintf("MAP_DMA of guest RAM (iova %#x, size %#x) returned %d", c.IOVA, c.Size, c.Ret)
			return
		}
		ms += c.ms()
		total += c.Size
		first, last = math.Min(first, c.Start), math.Max(last, c.End)
		spans = append(spans, addrRange{c.IOVA, c.IOVA + c.Size})
	}
	for _, c := range r.Other {
		otherMs += c.ms()
	}
	covered := unionBytes(spans)
	if covered+holeBytes < guestBytes || covered > guestBytes {
		s.Err = fmt.Sprintf("MAP_DMA calls of guest RAM cover %d of its %d bytes (%d calls): the mapping was not complete when the VMM was stopped", covered, guestBytes, len(r.RAM))
		return
	}
	s.Metrics[mDMAMapMs] = ms
	s.Metrics[mDMAMapCalls] = float64(len(r.RAM))
	s.Metrics[mDMAMapMiB] = float64(covered) / (1 << 20)
	s.Metrics[mDMAMapTotalMiB] = float64(total) / (1 << 20)
	s.Metrics[mDMASpanMs] = (last - first) * 1000
	s.Metrics[mDMAOtherCalls] = float64(len(r.Other))
	s.Metrics[mDMAOtherMs] = otherMs
}

// unionBytes is the size of the union of the ranges.
func unionBytes(rs []addrRange) uint64 {
	rs = append([]addrRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	var n, end uint64
	for i, r := range rs {
		if i == 0 || r.Start > end {
			n += r.End - r.Start
			end = r.End
		} else if r.End > end {
			n += r.End - end
			end = r.End
		}
	}
	return n
}

// mapTracer owns the two kprobe events in tracefs.
type mapTracer struct{ dir string }

// tracefsDirs are where tracefs may be mounted (ProfileBench mounts the
// first; the second appears under debugfs).
var tracefsDirs = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// startMapTracer installs and enables the MAP_DMA probes.
func startMapTracer() (*mapTracer, error) {
	var t *mapTracer
	for _, d := range tracefsDirs {
		if fileExists(filepath.Join(d, "kprobe_events")) {
			t = &mapTracer{dir: d}
			break
		}
	}
	if t == nil {
		return nil, fmt.Errorf("no tracefs with kprobe_events under %s (CONFIG_KPROBE_EVENTS, tracefs mounted?)", strings.Join(tracefsDirs, " or "))
	}
	t.remove() // leftovers of an interrupted run
	for _, d := range kprobeDefs {
		if err := t.write("kprobe_events", d+"\n", true); err != nil {
			t.remove()
			return nil, fmt.Errorf("defining the kprobe %q: %w (is vfio_iommu_type1 loaded?)", d, err)
		}
	}
	steps := []struct{ file, val string }{
		{"trace_clock", "mono"}, // one clock for all CPUs: a call may return on another CPU than it entered
		{"events/" + kprobeGroup + "/" + kprobeMap + "/filter", fmt.Sprintf("cmd == %d", vfioIOMMUMapDMA)},
		{"events/" + kprobeGroup + "/" + kprobeMap + "/enable", "1"},
		{"events/" + kprobeGroup + "/" + kprobeMapRet + "/enable", "1"},
		{"tracing_on", "1"},
	}
	for _, st := range steps {
		if err := t.write(st.file, st.val+"\n", false); err != nil {
			t.remove()
			return nil, err
		}
	}
	return t, nil
}

func (t *mapTracer) write(file, val string, appendTo bool) error {
	flags := os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(t.dir, file), flags, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %q to %s: %w", strings.TrimSpace(val), filepath.Join(t.dir, file), err)
	}
	return nil
}

// clear empties the trace buffer before a run.
func (t *mapTracer) clear() error { return t.write("trace", "", false) }

// calls parses what the buffer holds.
func (t *mapTracer) calls() ([]dmaCall, error) {
	f, err := os.Open(filepath.Join(t.dir, "trace"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMapTrace(f)
}

// remove disables and deletes this package's probes.
func (t *mapTracer) remove() {
	for _, e := range []string{kprobeMap, kprobeMapRet} {
		_ = t.write("events/"+kprobeGroup+"/"+e+"/enable", "0\n", false)
		_ = t.write("kprobe_events", "-:"+kprobeGroup+"/"+e+"\n", true)
	}
}
