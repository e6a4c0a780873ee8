package jobrun

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun/jobruntest"
)

// buildStatic builds the program in testdata/name with CGO_ENABLED=0, as
// an embedder builds its own agent.
func buildStatic(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a static Go program")
	}
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestCheckAgent is issue 35's agent check: a program that is not an
// hpcvmm agent is refused before it is packed, with one line naming it and
// what to do; a program whose main calls Dispatch passes.
func TestCheckAgent(t *testing.T) {
	refused := func(path string, want ...string) {
		t.Helper()
		err := CheckAgent(path, nil)
		require.Error(t, err, path)
		msg := err.Error()
		assert.NotContains(t, msg, "\n", "one line")
		assert.Contains(t, msg, path)
		for _, w := range want {
			assert.Contains(t, msg, w)
		}
	}
	// A dynamic program: the guest has IMAGE's libraries, not the host's.
	refused("/bin/true", "dynamically linked", "CGO_ENABLED=0")
	// A static program that never looks at argv[0] (initramfs's own check
	// passes it) would boot as a PID 1 that never answers.
	notAgent := buildStatic(t, "notagent")
	refused(notAgent, "not an hpcvmm agent", `answered "hello", exit status 0`, "does not dispatch on argv[0] hpcvmm-agent", "call jobrun.Dispatch")

	agent := buildStatic(t, "agent")
	start := time.Now()
	require.NoError(t, CheckAgent(agent, nil), "a program whose main calls Dispatch")
	t.Logf("the probe of a static Go agent: %v", time.Since(start))
	require.NoError(t, CheckAgent(jobruntest.Agent(t, ProbeAnswer()), nil), "the stand-in")
}

// script writes a shell script for probeAgent's own checks (CheckAgent
// refuses a script before its probe: it is no static ELF).
func script(t *testing.T, dir, body string) string {
	p := filepath.Join(dir, "probe.sh")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	return p
}

// TestProbeAgent: the probe takes exactly ProbeAnswer with exit status 0;
// another protocol version, a failure, silence past the timeout (its
// process group killed) are each refused, naming the file.
func TestProbeAgent(t *testing.T) {
	dir := t.TempDir()
	ok := strings.TrimSuffix(ProbeAnswer(), "\n")
	for _, c := range []struct {
		body string
		want string // "" passes
	}{
		{`[ "$1" = ` + probeArg + ` ] && echo "` + ok + `"`, ""},
		{`echo "` + ok + `"; exit 1`, "exit status 1"},
		{`echo "hpcvmm-agent jobproto 99"`, "speaks job protocol 99, this hpcvmm 1"},
		{`echo "` + ok + `"; echo more`, "not an hpcvmm agent"},
		// The environment is empty: nothing of hpcvmm's leaks in.
		{`[ -z "$HOME$USER$SLURM_JOB_ID" ] && echo "` + ok + `"`, ""},
		{`kill -9 $$`, "signal: killed"},
	} {
		t.Setenv("SLURM_JOB_ID", "1")
		err := probeAgent(script(t, dir, c.body), nil, 10*time.Second)
		if c.want == "" {
			assert.NoError(t, err, c.body)
			continue
		}
		require.Error(t, err, c.body)
		assert.Contains(t, err.Error(), c.want, c.body)
		assert.Contains(t, err.Error(), filepath.Join(dir, "probe.sh"), c.body)
	}
	// A child that keeps the output pipe: the whole group is killed at
	// the timeout, and the probe does not wait for the pipe.
	start := time.Now()
	err := probeAgent(script(t, dir, "sleep 60 & sleep 60"), nil, 300*time.Millisecond)
	require.ErrorContains(t, err, "did not answer within 300ms")
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestProbeAgentAsActingUser: under Slurm as root, the agent is started
// with the job user's rights, as every file the user names is opened.
func TestProbeAgentAsActingUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("acting for a Slurm job's user (SLURM_JOB_UID) needs root, as hpcvmm in a Slurm step")
	}
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	ok := strings.TrimSuffix(ProbeAnswer(), "\n")
	p := script(t, dir, `[ "$(id -u):$(id -g)" = 65534:65534 ] && echo "`+ok+`"`)
	nobody := &asuser.User{UID: 65534, GID: 65534}
	require.NoError(t, probeAgent(p, nobody, 10*time.Second))
	require.Error(t, probeAgent(p, nil, 10*time.Second), "as root the script does not answer")
	require.NoError(t, os.Chmod(p, 0o700))
	err := probeAgent(p, nobody, 10*time.Second)
	require.ErrorContains(t, err, "permission denied", "a file the user may not run")
}
