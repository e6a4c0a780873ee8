package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWithTestbedCPUMode(t *testing.T) {
	for _, c := range []struct {
		in, want []string
	}{
		{[]string{"run", "--cpus", "1"}, []string{"run", "--cpus", "1", "--cpu-mode", "shared"}},
		{[]string{"run", "--rootfs", "R", "--", "sh", "-c", "run --cpu-mode x"},
			[]string{"run", "--rootfs", "R", "--cpu-mode", "shared", "--", "sh", "-c", "run --cpu-mode x"}},
		{[]string{"run", "--cpu-mode", "dedicated"}, []string{"run", "--cpu-mode", "dedicated"}},
		{[]string{"run", "--cpu-mode=dedicated", "--", "x"}, []string{"run", "--cpu-mode=dedicated", "--", "x"}},
		{[]string{"check", "--json"}, []string{"check", "--json"}},
		{[]string{"check", "--", "run"}, []string{"check", "--", "run"}},
		{[]string{"/bin/hpcvmm", "run", "--", "--cpu-mode"}, []string{"/bin/hpcvmm", "run", "--cpu-mode", "shared", "--", "--cpu-mode"}},
	} {
		in := append([]string(nil), c.in...)
		assert.Equal(t, c.want, WithTestbedCPUMode(c.in), "%q", c.in)
		assert.Equal(t, in, c.in, "the input is not modified")
	}
}
