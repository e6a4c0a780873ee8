package vmm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/seccomp"
)

func TestSeccompModes(t *testing.T) {
	for m, want := range map[SeccompMode]struct {
		on   bool
		mode seccomp.Mode
	}{"": {}, SeccompOff: {}, SeccompOn: {true, seccomp.Kill}, SeccompLog: {true, seccomp.Log}} {
		mode, on := m.enabled()
		assert.Equal(t, want.on, on, "%q", m)
		assert.Equal(t, want.mode, mode, "%q", m)
		cfg := validConfig(t)
		cfg.Seccomp = m
		assert.NoError(t, cfg.Validate(), "%q", m)
	}
	cfg := validConfig(t)
	cfg.Seccomp = "strict"
	var fe *FieldError
	require.True(t, errors.As(cfg.Validate(), &fe))
	assert.Equal(t, "Seccomp", fe.Field)
	assert.Equal(t, SeccompMode(""), DefaultConfig().Seccomp, "the library's default installs no filter")
}
