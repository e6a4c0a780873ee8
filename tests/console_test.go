//go:build integration

package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

var notifyExitsRe = regexp.MustCompile(`notify_exits=(\d+)`)

// TestConsoleRoundTrip runs the stock kernel's virtio_console driver against
// hpcvmm's virtio-console: a marker written by the guest to /dev/hvc0 reaches
// hpcvmm's stdout, a line written to hpcvmm's stdin is read by the guest
// and echoed back, and 16 MiB sent by the guest arrive intact (checksums
// compared on the host side), with no virtqueue doorbell exiting to hpcvmm:
// ioeventfd and irqfd carry the data path.
func TestConsoleRoundTrip(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", "console=ttyS0 console=hvc0 reboot=k panic=-1 hpcvmm.scenario=console",
			"--cpus", "1", "--memory", "512M", "--hugepages", "none", "--console", "virtio",
		)
		_, ok := vm.WaitForLine("HPCVMM-HVC0 ready", 4*time.Minute)
		require.True(t, ok, "no ready marker from the guest's /dev/hvc0 on hpcvmm's stdout")

		const line = "hello-from-the-host-1234"
		_, err := fmt.Fprintf(vm.Stdin(), "%s\n", line)
		require.NoError(t, err)
		_, ok = vm.WaitForLine("HPCVMM-HVC0 echo:"+line, time.Minute)
		require.True(t, ok, "the guest did not echo the line written to hpcvmm's stdin")

		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		g := vm.GuestResults()
		assert.Equal(t, "virtio-pci", g["virtio_console_driver"], "PCI driver of the 1af4:1043 device")
		assert.Equal(t, "virtio_console", g["virtio_console_virtio_driver"], "virtio driver of the console device")

		out := []byte(vm.Console())
		begin := bytes.Index(out, []byte("HPCVMM-BLOB-BEGIN\n"))
		end := bytes.LastIndex(out, []byte("HPCVMM-BLOB-END\n"))
		require.True(t, begin >= 0 && end > begin, "blob markers not found on stdout")
		blob := out[begin+len("HPCVMM-BLOB-BEGIN\n") : end]
		sum := sha256.Sum256(blob)
		assert.Equal(t, 16<<20, len(blob), "bytes between the markers")
		assert.Equal(t, g["blob_sha256"], hex.EncodeToString(sum[:]), "sha256 of the 16 MiB as sent by the guest and as received on stdout")

		m := notifyExitsRe.FindStringSubmatch(vm.Log())
		require.NotNil(t, m, "hpcvmm logged no notify_exits count")
		n, _ := strconv.Atoi(m[1])
		assert.Zero(t, n, "virtqueue doorbells that exited to hpcvmm instead of their ioeventfd")
		env.Record(t, "notify_exits", m[1])
		env.Record(t, "blob_seconds_guest", g["blob_seconds"])
	})
}
