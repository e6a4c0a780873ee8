package ninep

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/seccomp"
)

// refusalInterval is how often the child writes a line for one kind of
// refusal at most.
const refusalInterval = 10 * time.Second

// childConfig is what the child's arguments say.
type childConfig struct {
	msize   uint32
	mode    string // "off", "kill" or "log"
	exports []childExport
}

// childExport is one export of the child's arguments: a directory's
// access, or a file set's shape and names.
type childExport struct {
	readOnly bool
	set      *childSet
}

type childSet struct {
	dirs  int
	names []string
	dirOf []int
	links []SetLink
}

// parseSetArgs parses a file set's arguments (setArgs) from args[0]; it
// returns the set and how many arguments it took.
func parseSetArgs(args []string) (*childSet, int, error) {
	var d, f, l int
	if n, err := fmt.Sscanf(args[0], "set:%d:%d:%d", &d, &f, &l); n != 3 || err != nil || fmt.Sprintf("set:%d:%d:%d", d, f, l) != args[0] ||
		d < 0 || f < 0 || l < 0 || d > f || f+l > MaxSetEntries || len(args) < 1+f+l {
		return nil, 0, fmt.Errorf("file set %q: not set:DIRS:FILES:LINKS with that many names after it", args[0])
	}
	s := &childSet{dirs: d}
	seen := map[string]bool{}
	for _, a := range args[1 : 1+f] {
		dir, name, ok := strings.Cut(a, "/")
		i, err := strconv.Atoi(dir)
		if !ok || err != nil || i < 0 || i >= d || !validName(name) || seen[name] {
			return nil, 0, fmt.Errorf("file set entry %q: not DIR/NAME with a directory below %d and a new name", a, d)
		}
		seen[name] = true
		s.names, s.dirOf = append(s.names, name), append(s.dirOf, i)
	}
	for _, a := range args[1+f : 1+f+l] {
		name, target, ok := strings.Cut(a, "/")
		if !ok || !validName(name) || seen[name] {
			return nil, 0, fmt.Errorf("file set link %q: not NAME/TARGET with a new name", a)
		}
		seen[name] = true
		s.links = append(s.links, SetLink{Name: name, Target: target})
	}
	for _, l := range s.links {
		if !seen[l.Target] || l.Target == l.Name {
			return nil, 0, fmt.Errorf("file set link %s: target %q is not another name of the set", l.Name, l.Target)
		}
	}
	if !slices.IsSortedFunc(s.links, func(a, b SetLink) int { return strings.Compare(a.Name, b.Name) }) ||
		!slices.IsSorted(s.names) {
		return nil, 0, fmt.Errorf("file set %q: names not in order", args[0])
	}
	return s, 1 + f + l, nil
}

// parseChildArgs checks the child's arguments: -msize N -seccomp
// off|kill|log, then rw or ro for each directory export, a file set's
// arguments for each set (setArgs). Log mode is for finding the list by
// hand (hpcvmm-9p run with -seccomp log, the kernel's audit lines read
// back); Spawn passes off or kill.
func parseChildArgs(args []string) (childConfig, error) {
	var c childConfig
	if len(args) < 5 || args[0] != "-msize" || args[2] != "-seccomp" {
		return c, fmt.Errorf("usage: %s -msize N -seccomp off|kill|log rw|ro...: started by hpcvmm, not by hand", ChildName)
	}
	m, err := strconv.ParseUint(args[1], 10, 32)
	if err != nil {
		return c, fmt.Errorf("-msize %q: not a size in bytes", args[1])
	}
	c.msize = uint32(m)
	if _, err := (Options{MaxMessageSize: c.msize}).messageSize(); err != nil {
		return c, err
	}
	switch c.mode = args[3]; c.mode {
	case "off", "kill", "log":
	default:
		return c, fmt.Errorf("-seccomp %q: give off, kill or log", args[3])
	}
	for rest := args[4:]; len(rest) > 0; {
		switch a := rest[0]; {
		case a == "rw" || a == "ro":
			c.exports = append(c.exports, childExport{readOnly: a == "ro"})
			rest = rest[1:]
		case strings.HasPrefix(a, "set:"):
			set, n, err := parseSetArgs(rest)
			if err != nil {
				return c, err
			}
			c.exports = append(c.exports, childExport{readOnly: true, set: set})
			rest = rest[n:]
		default:
			return c, fmt.Errorf("export flag %q: give rw, ro or a file set", a)
		}
	}
	return c, nil
}

// childFiles checks and wraps the descriptors of export i from base on
// (Spawn's order): a directory and two pipes (or sockets), requests to
// read and replies to write; for a file set, the pipes, then set.dirs
// directories and a regular file per name. It returns the descriptor
// after them.
func childFiles(i, base int, set *childSet) (ex Export, requests, replies *os.File, next int, err error) {
	kinds := []uint32{unix.S_IFDIR, unix.S_IFIFO, unix.S_IFIFO}
	pipeAt := 1
	if set != nil {
		kinds, pipeAt = []uint32{unix.S_IFIFO, unix.S_IFIFO}, 0
		for range set.dirs {
			kinds = append(kinds, unix.S_IFDIR)
		}
		for range set.names {
			kinds = append(kinds, unix.S_IFREG)
		}
	}
	files := make([]*os.File, len(kinds))
	for j, want := range kinds {
		fd := base + j
		st, err := statFD(fd)
		if err != nil {
			return Export{}, nil, nil, 0, fmt.Errorf("export %d: descriptor %d: %w", i, fd, err)
		}
		got := st.Mode & unix.S_IFMT
		if got != want && !(want == unix.S_IFIFO && got == unix.S_IFSOCK) {
			return Export{}, nil, nil, 0, fmt.Errorf("export %d: descriptor %d is of type %#o, want %#o", i, fd, got, want)
		}
		unix.CloseOnExec(fd)
		if j == pipeAt || j == pipeAt+1 {
			// Non-blocking, so that os.NewFile makes the pipes
			// pollable: a request waiting for the guest parks a
			// goroutine, not a thread.
			if err := unix.SetNonblock(fd, true); err != nil {
				return Export{}, nil, nil, 0, fmt.Errorf("export %d: descriptor %d: %w", i, fd, err)
			}
		}
		files[j] = os.NewFile(uintptr(fd), fmt.Sprintf("export-%d-%d", i, j))
	}
	requests, replies = files[pipeAt], files[pipeAt+1]
	if set == nil {
		return Export{Root: files[0]}, requests, replies, base + len(files), nil
	}
	fs := &FileSet{dirs: files[2 : 2+set.dirs], links: set.links}
	for k, name := range set.names {
		fs.files = append(fs.files, setFile{name: name, dir: set.dirOf[k], f: files[2+set.dirs+k]})
	}
	return Export{Files: fs}, requests, replies, base + len(files), nil
}

// ChildMain is the file server child's main: cmd/hpcvmm calls it when its
// argv[0] is ChildName, and exits with what it returns (0 when every
// connection has ended, 2 for arguments or descriptors it refuses, 1 when
// the filter cannot be installed). It checks its arguments and
// descriptors, installs the FileServer seccomp filter when asked, and
// serves every export until all connections end. Refusals go to stderr,
// rate-limited.
func ChildMain() int {
	if os.Getppid() == 1 {
		return 1 // hpcvmm is already gone
	}
	c, err := parseChildArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", ChildName, err)
		return 2
	}
	type files struct {
		ex       Export
		req, rep *os.File
	}
	var fs []files
	next := 3
	for i, e := range c.exports {
		ex, req, rep, n, err := childFiles(i, next, e.set)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", ChildName, err)
			return 2
		}
		ex.ReadOnly, next = e.readOnly, n
		fs = append(fs, files{ex, req, rep})
	}
	log := NewRateLimiter(os.Stderr, refusalInterval)
	switch c.mode {
	case "kill", "log":
		m := seccomp.Kill
		if c.mode == "log" {
			m = seccomp.Log
		}
		if err := seccomp.InstallFileServer(m); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", ChildName, err)
			return 1
		}
	}
	var wg sync.WaitGroup
	for i, f := range fs {
		o := Options{MaxMessageSize: c.msize, Refused: func(what string) {
			log.Report(fmt.Sprintf("export %d: %s", i, what))
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := Serve(f.ex, f.req, f.rep, o); err != nil {
				fmt.Fprintf(os.Stderr, "%s: export %d: %v\n", ChildName, i, err)
			}
		}()
	}
	wg.Wait()
	log.Flush()
	return 0
}
