package ninep

import (
	"fmt"
	"os"
	"strconv"
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
	msize    uint32
	mode     string // "off", "kill" or "log"
	readOnly []bool
}

// parseChildArgs checks the child's arguments: -msize N -seccomp
// off|kill|log, then rw or ro for each export. Log mode is for finding
// the list by hand (hpcvmm-9p run with -seccomp log, the kernel's audit
// lines read back); Spawn passes off or kill.
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
	for _, a := range args[4:] {
		switch a {
		case "rw", "ro":
			c.readOnly = append(c.readOnly, a == "ro")
		default:
			return c, fmt.Errorf("export flag %q: give rw or ro", a)
		}
	}
	return c, nil
}

// childFiles checks and wraps the descriptors of export i: a directory,
// a pipe (or socket) to read requests from, one to write replies to.
func childFiles(i int) (root, requests, replies *os.File, err error) {
	base := 3 + 3*i
	kinds := []uint32{unix.S_IFDIR, unix.S_IFIFO, unix.S_IFIFO}
	for j, want := range kinds {
		st, err := statFD(base + j)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("export %d: descriptor %d: %w", i, base+j, err)
		}
		got := st.Mode & unix.S_IFMT
		if got != want && !(want == unix.S_IFIFO && got == unix.S_IFSOCK) {
			return nil, nil, nil, fmt.Errorf("export %d: descriptor %d is of type %#o, want %#o", i, base+j, got, want)
		}
		unix.CloseOnExec(base + j)
		if j > 0 {
			// Non-blocking, so that os.NewFile makes the pipes
			// pollable: a request waiting for the guest parks a
			// goroutine, not a thread.
			if err := unix.SetNonblock(base+j, true); err != nil {
				return nil, nil, nil, fmt.Errorf("export %d: descriptor %d: %w", i, base+j, err)
			}
		}
	}
	return os.NewFile(uintptr(base), "export-"+strconv.Itoa(i)),
		os.NewFile(uintptr(base+1), "requests-"+strconv.Itoa(i)),
		os.NewFile(uintptr(base+2), "replies-"+strconv.Itoa(i)), nil
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
	type files struct{ root, req, rep *os.File }
	var fs []files
	for i := range c.readOnly {
		root, req, rep, err := childFiles(i)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", ChildName, err)
			return 2
		}
		fs = append(fs, files{root, req, rep})
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
			if err := Serve(Export{Root: f.root, ReadOnly: c.readOnly[i]}, f.req, f.rep, o); err != nil {
				fmt.Fprintf(os.Stderr, "%s: export %d: %v\n", ChildName, i, err)
			}
		}()
	}
	wg.Wait()
	log.Flush()
	return 0
}
