package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSlurmDocScripts: the slurm profile's Prolog, Epilog and slurm.conf
// lines come from docs/slurm.md, changed only where L1 differs (its bridge,
// its nic that is not InfiniBand, two nodes on one host).
func TestSlurmDocScripts(t *testing.T) {
	root, err := ModuleRoot()
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "slurm.md"))
	require.NoError(t, err)
	prolog, epilog, conf, err := SlurmDocScripts(string(doc))
	require.NoError(t, err)

	assert.True(t, strings.HasPrefix(prolog, "#!/bin/sh\n"), prolog)
	assert.Contains(t, prolog, "\nset -e\n")
	assert.Contains(t, prolog, `hpcvmm bind --if-any --owner "$SLURM_JOB_UID" --tap "hpvm$SLURM_JOB_ID$SLURMD_NODENAME,bridge=`+SlurmBridge+`"`)
	assert.Contains(t, prolog, "--gpu slurm --vf slurm\n")
	assert.NotContains(t, prolog, "guid=")
	assert.NotContains(t, prolog, "=br0")
	assert.True(t, strings.HasPrefix(epilog, "#!/bin/sh\n"), epilog)
	assert.Contains(t, epilog, "\nhpcvmm unbind")
	for _, s := range []string{prolog, epilog} {
		assert.Contains(t, s, "\nexport PATH=", "Slurm runs them without a search path")
	}
	assert.Equal(t, "PrologFlags=Alloc,Contain\nProlog=/etc/slurm/prolog.d/hpcvmm.sh\nEpilog=/etc/slurm/epilog.d/hpcvmm.sh\nPropagateResourceLimitsExcept=MEMLOCK\n", conf)
	assert.Equal(t, "hpvm42n1", SlurmTAP("42", "n1"))

	// A document whose Prolog no longer has what L1 replaces fails the
	// build instead of testing another Prolog.
	_, _, _, err = SlurmDocScripts(strings.Replace(string(doc), "bridge=br0", "bridge=br1", 1))
	assert.ErrorContains(t, err, `"bridge=br0" 0 times`)
	_, _, _, err = SlurmDocScripts(strings.Replace(string(doc), "# /etc/slurm/epilog.d/hpcvmm.sh", "# epilog", 1))
	assert.ErrorContains(t, err, "no sh block")
	_, _, _, err = SlurmDocScripts(strings.Replace(string(doc), "PrologFlags=Alloc,Contain\n", "", 1))
	assert.ErrorContains(t, err, "want one line each")
}
