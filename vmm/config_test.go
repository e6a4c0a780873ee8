package vmm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/virtio/console"
)

func validConfig(t *testing.T) Config {
	dir := t.TempDir()
	k := filepath.Join(dir, "bzImage")
	require.NoError(t, os.WriteFile(k, []byte("kernel"), 0o644))
	cfg := DefaultConfig()
	cfg.Kernel = k
	return cfg
}

// fieldOf returns the fields named by every FieldError in err.
func fieldsOf(err error) []string {
	var out []string
	var joined interface{ Unwrap() []error }
	list := []error{err}
	if errors.As(err, &joined) {
		list = joined.Unwrap()
	}
	for _, e := range list {
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe.Field)
		}
	}
	return out
}

func TestValidateAcceptsDefaults(t *testing.T) {
	cfg := validConfig(t)
	require.NoError(t, cfg.Validate())
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		field  string
		text   string
	}{
		{"no kernel", func(c *Config) { c.Kernel = "" }, "Kernel", "no kernel given"},
		{"missing kernel", func(c *Config) { c.Kernel = "/nonexistent/bzImage" }, "Kernel", "does not exist"},
		{"kernel is a dir", func(c *Config) { c.Kernel = os.TempDir() }, "Kernel", "directory"},
		{"missing initrd", func(c *Config) { c.Initrd = "/nonexistent/initrd" }, "Initrd", "does not exist"},
		{"zero cpus", func(c *Config) { c.CPUs = 0 }, "CPUs", "at least 1"},
		{"too many cpus", func(c *Config) { c.CPUs = 4096 }, "CPUs", "at most"},
		{"no memory", func(c *Config) { c.Memory = 0 }, "Memory", "no guest memory"},
		{"tiny memory", func(c *Config) { c.Memory = 1 << 20 }, "Memory", "too small"},
		{"not a page multiple", func(c *Config) { c.Memory = 1536 << 20 }, "Memory", "not a multiple of the 1G page size"},
		{"odd page size", func(c *Config) { c.HugePages = 12345 }, "HugePages", "is not 1G, 2M or 4K"},
		{"bad node", func(c *Config) { c.NUMANode = -7 }, "NUMANode", "not a node"},
		{"duplicate cpu", func(c *Config) { c.CPUList = []int{1, 1} }, "CPUList", "twice"},
		{"bad console", func(c *Config) { c.Console = "vga" }, "Console", "unknown console"},
		{"bad bridge name", func(c *Config) { c.Nets = []NetConfig{{TAP: "t0", Bridge: "br/0"}} }, "Nets", "bridge=br/0"},
		{"ports without virtio console", func(c *Config) {
			c.Console = ConsoleSerial
			c.ConsolePorts = []console.Port{{Name: "a"}}
		}, "ConsolePorts", "need the virtio console"},
		{"duplicate port name", func(c *Config) { c.ConsolePorts = []console.Port{{Name: "a"}, {Name: "a"}} }, "ConsolePorts", `ports[1]: name "a" used twice`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig(t)
			tc.mutate(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			assert.Contains(t, fieldsOf(err), tc.field)
			assert.Contains(t, err.Error(), tc.text)
			// The Go API speaks of Config fields; flags are the CLI's
			// words (cmd/hpcvmm maps each field to its flag).
			assert.NotContains(t, err.Error(), "--", "an API error names no flag")
		})
	}
}

func TestValidate2MPagesAcceptsMultiple(t *testing.T) {
	cfg := validConfig(t)
	cfg.HugePages = guestmem.Page2M
	cfg.Memory = 1536 << 20
	require.NoError(t, cfg.Validate())
}
