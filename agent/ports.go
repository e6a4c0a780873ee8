package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FindPorts maps each of names to its device (/dev/vportNpM) by the names
// the host gave the ports (/sys/class/virtio-ports/vportNpM/name under
// sysRoot, devices under devRoot). Ports appear when virtio_console has
// probed the device and the host has added them, and their device nodes
// when devtmpfs has made them, so it polls until all are there or timeout
// passes; the error then names the ports still missing.
func FindPorts(sysRoot, devRoot string, names []string, timeout time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		found := map[string]string{}
		entries, _ := os.ReadDir(filepath.Join(sysRoot, "class/virtio-ports"))
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(sysRoot, "class/virtio-ports", e.Name(), "name"))
			if err != nil {
				continue
			}
			dev := filepath.Join(devRoot, e.Name())
			if _, err := os.Stat(dev); err != nil {
				continue
			}
			found[strings.TrimSpace(string(b))] = dev
		}
		var missing []string
		for _, n := range names {
			if _, ok := found[n]; !ok {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return found, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("virtio-console ports %s not found within %v (is virtio_console loaded? %d ports seen in %s)",
				strings.Join(missing, ", "), timeout, len(found), filepath.Join(sysRoot, "class/virtio-ports"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
