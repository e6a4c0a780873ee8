//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// consoleInputDelay is how long after boot the guest first opens its console
// to read: long after its driver came up and after hpcvmm read all of stdin.
const consoleInputDelay = 30

// TestConsoleInputAtLaunchVirtio: a line on hpcvmm's stdin from the start
// (then end of file, as with `printf 'line\n' | hpcvmm run`) reaches a guest
// that opens /dev/hvc0 only consoleInputDelay seconds after boot.
func TestConsoleInputAtLaunchVirtio(t *testing.T) {
	consoleInputAtLaunch(t, "virtio", "hvc0", "console=ttyS0 console=hvc0")
}

// TestConsoleInputAtLaunchSerial is the same through the 16550 UART and the
// guest's /dev/ttyS0.
func TestConsoleInputAtLaunchSerial(t *testing.T) {
	consoleInputAtLaunch(t, "serial", "ttyS0", "console=ttyS0")
}

func consoleInputAtLaunch(t *testing.T, console, dev, consoles string) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		line := fmt.Sprintf("given at launch via %s, before the guest booted: 7f3a", console)
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s reboot=k panic=-1 hpcvmm.scenario=consoleinput hpcvmm.input_dev=%s hpcvmm.input_delay=%d",
				consoles, dev, consoleInputDelay),
			"--cpus", "1", "--memory", "512M", "--hugepages", "none", "--console", console,
		)
		start := time.Now()
		_, err := fmt.Fprintf(vm.Stdin(), "%s\n", line)
		require.NoError(t, err)
		require.NoError(t, vm.CloseStdin(), "end of file right after the line")

		_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER input-open", 4*time.Minute)
		require.True(t, ok, "the guest never got to opening /dev/%s", dev)
		_, ok = vm.WaitForLine("HPCVMM-INPUT got:", 90*time.Second)
		require.True(t, ok, "the guest's read of /dev/%s never returned", dev)
		elapsed := time.Since(start)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		// Host side: hpcvmm's output carries the guest's marker with the
		// exact line (looked up once hpcvmm exited: WaitForLine may see
		// the line while its bytes are still arriving).
		var got string
		for _, l := range strings.Split(vm.Console(), "\n") {
			if strings.HasPrefix(l, "HPCVMM-INPUT got:") {
				got = strings.TrimRight(l, "\r")
			}
		}
		assert.Equal(t, "HPCVMM-INPUT got:["+line+"]", got, "marker line on hpcvmm's stdout")

		// Guest side: what the guest's read returned.
		g := vm.GuestResults()
		sum := sha256.Sum256([]byte(line))
		assert.Equal(t, hex.EncodeToString(sum[:]), g["input_line_sha256"], "sha256 of the line the guest read from /dev/%s", dev)
		assert.Equal(t, strconv.Itoa(len(line)), g["input_line_bytes"], "length of the line the guest read")
		waited, err := strconv.ParseFloat(g["input_read_uptime"], 64)
		require.NoError(t, err, "input_read_uptime")
		assert.GreaterOrEqual(t, waited, float64(consoleInputDelay), "the guest read only after its delay")
		env.Record(t, "guest_read_uptime_s", g["input_read_uptime"])
		env.Record(t, "host_seconds_to_marker", fmt.Sprintf("%.1f", elapsed.Seconds()))
	})
}
