package jobrun

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJobCmdline(t *testing.T) {
	require.Equal(t, "console=ttyS0 quiet reboot=k panic=-1 rdinit=/.hpcvmm/hpcvmm-agent", jobCmdline(""))
	require.Equal(t, "console=ttyS0 rdinit=/.hpcvmm/hpcvmm-agent", jobCmdline("console=ttyS0"))
	require.Equal(t, "rdinit=/x", jobCmdline("rdinit=/x"))
}

func TestConsoleWatch(t *testing.T) {
	var out bytes.Buffer
	c := &consoleWatch{w: &out}
	for _, chunk := range []string{"[    0.1] boot\r\n", "hpcvmm-agent: cannot reach hpc", "vmm: ports missing\n", "more\n"} {
		n, err := c.Write([]byte(chunk))
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	require.Equal(t, "hpcvmm-agent: cannot reach hpcvmm: ports missing", c.Last())
	_, _ = c.Write([]byte("[    2.5] Kernel panic - not syncing: Attempted to kill init!\n"))
	require.Equal(t, "guest kernel panic - not syncing: Attempted to kill init!", c.Last())
	require.Contains(t, out.String(), "more\n")
	line := []byte("ordinary console line\n")
	require.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Write(line) }))
}

// TestBindTuning: Request.BindMSize and BindCache (the hidden
// --bind-msize and --bind-cache, the bench's knobs) give the binds' mount
// settings; without them the defaults; out of range or unknown is the
// user's error.
func TestBindTuning(t *testing.T) {
	m, c, err := tuning(&Request{})
	require.NoError(t, err)
	assert.Equal(t, uint32(DefaultBindMSize), m)
	assert.Equal(t, DefaultBindCache, c)
	for _, size := range []uint64{4096, 128 << 10, 1 << 20, 4 << 20} {
		m, c, err := tuning(&Request{BindMSize: size, BindCache: "loose"})
		require.NoError(t, err, size)
		assert.Equal(t, uint32(size), m)
		assert.Equal(t, "loose", c)
	}
	for _, bad := range []Request{{BindMSize: 4095}, {BindMSize: 4<<20 + 1}, {BindCache: "mmap,rw"}, {BindCache: "Loose"}} {
		_, _, err := tuning(&bad)
		assert.Error(t, err, "%+v", bad)
	}
}

// TestExampleIsShort: the compiled example runs a job in under 25 lines
// (issue 35: the smallest program was 67 before jobrun).
func TestExampleIsShort(t *testing.T) {
	b, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	body := regexp.MustCompile(`(?ms)^func Example\(\) \{\n.*?^\}\n`).Find(b)
	require.NotNil(t, body, "example_test.go has func Example")
	lines := strings.Count(string(body), "\n")
	assert.Less(t, lines, 25, "%s", body)
	assert.Contains(t, string(body), "jobrun.Run(", "through the one call")
}
