package harness

import (
	"net"
	"os"
	"time"
)

// defaultStallLimit is how long L1 may write nothing to its console and
// result port before the harness calls it hung. Every scenario step is
// bounded well below it (one hpcvmm run by HPCVMM_VM_TIMEOUT, 4m), so
// silence this long means L1 itself stopped, which nested KVM under TCG
// has been seen to do; killing it early leaves the suite time to report.
const defaultStallLimit = 8 * time.Minute

// stallLimit is HPCVMM_L1_STALL or the default.
func stallLimit() time.Duration {
	if v, err := time.ParseDuration(os.Getenv("HPCVMM_L1_STALL")); err == nil && v > 0 {
		return v
	}
	return defaultStallLimit
}

// watchProgress calls onStall once if neither the console nor the result
// file of r grows for limit. The returned func stops the watch.
func watchProgress(r *l1Run, limit time.Duration, onStall func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		size := func() int64 {
			var n int64
			for _, p := range []string{r.consolePath, r.resultsPath} {
				if fi, err := os.Stat(p); err == nil {
					n += fi.Size()
				}
			}
			return n
		}
		last, since := size(), time.Now()
		tick := time.NewTicker(min(5*time.Second, limit/4))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if n := size(); n != last {
					last, since = n, time.Now()
				} else if time.Since(since) >= limit {
					onStall()
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// dumpMonitor asks QEMU's monitor for the L1 vCPUs' registers and saves
// the answer, so a hang can be told apart: L1 kernel idle, spinning, or
// inside its nested guest.
func dumpMonitor(sock, out string) {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		_ = os.WriteFile(out, []byte("monitor: "+err.Error()+"\n"), 0o644)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write([]byte("info registers -a\ninfo cpus\n"))
	time.Sleep(2 * time.Second)
	buf := make([]byte, 1<<20)
	n, _ := c.Read(buf)
	_ = os.WriteFile(out, buf[:n], 0o644)
}
