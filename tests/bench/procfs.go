package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// kvmDebugfs is where KVM keeps one directory of statistics per VM, named
// "PID-FD" after the process and its VM file descriptor. The per-vCPU
// counters (exits, io_exits, ...) appear there summed over the VM's vCPUs,
// which makes them comparable between VMMs without any VMM's help.
const kvmDebugfs = "/sys/kernel/debug/kvm"

// readKVMStats reads every single-number statistic of the VM(s) process
// pid created. KVM names the directory after the thread that issued
// KVM_CREATE_VM (task_pid_nr(current) is a thread id), which in a Go VMM
// is rarely the main thread, so every thread id of the process is tried.
// The creating thread may have exited since (a Go thread locked by a
// goroutine that returned is destroyed, which is where hpcvmm's start-up
// creates its VM), so the VM's file descriptor is matched too: a
// directory "TID-FD" whose FD is one of pid's anon_inode:kvm-vm
// descriptors and whose TID is no running process's. If the process has
// several VMs (a VMM probing KVM with a throwaway VM), the one with the
// most exits wins.
func readKVMStats(root, procRoot string, pid int) (map[string]float64, error) {
	ids := []string{strconv.Itoa(pid)}
	if ents, err := os.ReadDir(filepath.Join(procRoot, strconv.Itoa(pid), "task")); err == nil {
		for _, e := range ents {
			if e.Name() != ids[0] {
				ids = append(ids, e.Name())
			}
		}
	}
	var dirs []string
	for _, id := range ids {
		d, err := filepath.Glob(filepath.Join(root, id+"-*"))
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, d...)
	}
	dirs = append(dirs, vmDirsByFD(root, procRoot, pid)...)
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no KVM statistics for pid %d or its threads under %s (debugfs not mounted, or no VM yet)", pid, root)
	}
	var best map[string]float64
	for _, d := range dirs {
		st, err := readStatDir(d)
		if err != nil {
			continue
		}
		if best == nil || st["exits"] > best["exits"] {
			best = st
		}
	}
	if best == nil {
		return nil, fmt.Errorf("KVM statistics of pid %d under %s: no readable counters", pid, root)
	}
	return best, nil
}

// readStatDir reads the counter files of one KVM debugfs VM directory.
// Files that hold something other than one number (histograms) are skipped.
func readStatDir(dir string) (map[string]float64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, e := range ents {
		if e.IsDir() {
			continue // per-vCPU directories: the VM-level files already sum them
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		out[e.Name()] = float64(v)
	}
	return out, nil
}

// memInfo is what the suite reads from /proc/PID/status and smaps.
type memInfo struct {
	RSSKiB     uint64 // VmRSS + HugetlbPages: hugetlb pages are in neither VmRSS nor smaps' Rss
	HWMKiB     uint64 // VmHWM
	HugetlbKiB uint64 // HugetlbPages
	AnonKiB    uint64 // RssAnon: the Go heap and stacks, malloc arenas
	FileKiB    uint64 // RssFile: the binary's and libraries' pages in use
	Threads    uint64 // Threads
	// LargestAnonKiB is the largest Anonymous count of one mapping: in a
	// Go VMM the heap arena, so RssAnon minus it is stacks and the rest.
	LargestAnonKiB uint64
	GuestRSSKiB    uint64 // Rss + Shared_Hugetlb + Private_Hugetlb of the mappings identified as guest RAM
	GuestMaps      int    // how many mappings those were
}

// readMemInfo reads the VMM's resident memory and the resident part of its
// guest RAM. Guest RAM is identified by size: every mapping at least
// ramBytes*7/8 large and no larger than ramBytes plus 64 MiB (QEMU and
// gokvm map RAM anonymously, sometimes with alignment slack; hpcvmm maps
// one memfd). A VMM's other mappings (thread stacks, heaps, ROMs) are far
// smaller than a 512 MiB guest.
func readMemInfo(procRoot string, pid int, ramBytes uint64) (memInfo, error) {
	var mi memInfo
	base := filepath.Join(procRoot, strconv.Itoa(pid))
	st, err := os.ReadFile(filepath.Join(base, "status"))
	if err != nil {
		return mi, fmt.Errorf("reading %s/status: %w", base, err)
	}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "VmRSS":
			mi.RSSKiB = parseKiB(v)
		case "VmHWM":
			mi.HWMKiB = parseKiB(v)
		case "HugetlbPages":
			mi.HugetlbKiB = parseKiB(v)
		case "RssAnon":
			mi.AnonKiB = parseKiB(v)
		case "RssFile":
			mi.FileKiB = parseKiB(v)
		case "Threads":
			mi.Threads = parseKiB(v)
		}
	}
	mi.RSSKiB += mi.HugetlbKiB
	f, err := os.Open(filepath.Join(base, "smaps"))
	if err != nil {
		return mi, fmt.Errorf("reading %s/smaps: %w", base, err)
	}
	defer f.Close()
	mi.GuestRSSKiB, mi.GuestMaps, mi.LargestAnonKiB, err = guestRSSFromSmaps(bufio.NewScanner(f), ramBytes)
	return mi, err
}

// guestRSSFromSmaps sums the resident memory of the guest-RAM-sized
// mappings in smaps: Rss, plus the hugetlb pages, which smaps counts apart.
func guestRSSFromSmaps(sc *bufio.Scanner, ramBytes uint64) (rssKiB uint64, n int, largestAnonKiB uint64, err error) {
	lo, hi := ramBytes/8*7, ramBytes+64<<20
	inGuest := false
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			// A mapping header: "start-end perms offset dev inode [path]".
			a, b, ok := strings.Cut(f[0], "-")
			start, err1 := strconv.ParseUint(a, 16, 64)
			end, err2 := strconv.ParseUint(b, 16, 64)
			inGuest = false
			if ok && err1 == nil && err2 == nil && end > start {
				if size := end - start; size >= lo && size <= hi {
					inGuest = true
					n++
				}
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "Anonymous:"); ok && !inGuest {
			largestAnonKiB = max(largestAnonKiB, parseKiB(v))
		}
		if !inGuest {
			continue
		}
		for _, k := range []string{"Rss:", "Shared_Hugetlb:", "Private_Hugetlb:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				rssKiB += parseKiB(v)
			}
		}
	}
	return rssKiB, n, largestAnonKiB, sc.Err()
}

// parseKiB parses "   1234 kB".
func parseKiB(s string) uint64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseUint(f[0], 10, 64)
	return v
}

// logRecord finds the first log/slog text line of log whose msg is msg and
// returns its attributes (msg, time and level excluded).
func logRecord(log, msg string) (map[string]string, bool) {
	for _, line := range strings.Split(log, "\n") {
		attrs := parseLogfmt(line)
		if attrs["msg"] != msg {
			continue
		}
		delete(attrs, "msg")
		delete(attrs, "time")
		delete(attrs, "level")
		return attrs, true
	}
	return nil, false
}

// parseLogfmt splits a log/slog TextHandler line into its key=value pairs.
// Quoted values are unquoted; a malformed pair ends the parse.
func parseLogfmt(line string) map[string]string {
	out := map[string]string{}
	s := strings.TrimSpace(line)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \t\"") {
			break
		}
		k := s[:eq]
		s = s[eq+1:]
		var v string
		if strings.HasPrefix(s, `"`) {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				break
			}
			v, _ = strconv.Unquote(q)
			s = s[len(q):]
		} else {
			end := strings.IndexAny(s, " \t")
			if end < 0 {
				end = len(s)
			}
			v, s = s[:end], s[end:]
		}
		out[k] = v
		s = strings.TrimLeft(s, " \t")
	}
	return out
}

// durationMs parses a Go duration ("12.345ms") into milliseconds.
func durationMs(s string) (float64, bool) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, false
	}
	return float64(d) / float64(time.Millisecond), true
}

// vmDirsByFD returns the KVM debugfs directories named after one of pid's
// VM file descriptors whose thread id is not a running process: VMs pid
// created on a thread that has exited.
func vmDirsByFD(root, procRoot string, pid int) []string {
	fdDir := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err != nil || target != "anon_inode:kvm-vm" {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(root, "*-"+e.Name()))
		for _, m := range matches {
			tid, _, _ := strings.Cut(filepath.Base(m), "-")
			if tid == strconv.Itoa(pid) {
				continue // found by thread id already
			}
			if _, err := os.Stat(filepath.Join(procRoot, tid)); err == nil {
				// A running thread group's id, or one of pid's own
				// threads (a thread id resolves in /proc too): the
				// thread-id lookup has it if it is pid's.
				continue
			}
			dirs = append(dirs, m)
		}
	}
	return dirs
}
