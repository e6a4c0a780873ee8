package slurm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJobRunning: squeue's answers as Slurm 22.05 gives them: a state per
// line, "Invalid job id specified" with exit status 1 for a purged job, an
// error for an unreachable controller (which must not read as "ended").
func TestJobRunning(t *testing.T) {
	type answer struct {
		out, errOut string
		err         error
	}
	var asked []string
	ask := func(a answer) func(args ...string) ([]byte, []byte, error) {
		return func(args ...string) ([]byte, []byte, error) {
			asked = args
			return []byte(a.out), []byte(a.errOut), a.err
		}
	}
	exit1 := errors.New("exit status 1")
	for _, tc := range []struct {
		a       answer
		running bool
		err     string
	}{
		{answer{out: "RUNNING\n"}, true, ""},
		{answer{out: "COMPLETING\n"}, true, ""},
		{answer{out: "PENDING\n"}, true, ""},
		{answer{out: "SUSPENDED\n"}, true, ""},
		{answer{out: "SOME_NEW_STATE\n"}, true, ""},
		{answer{out: "COMPLETED\n"}, false, ""},
		{answer{out: "CANCELLED\nTIMEOUT\n"}, false, ""},
		{answer{out: "COMPLETED\nRUNNING\n"}, true, ""},
		{answer{out: ""}, false, ""},
		{answer{errOut: "slurm_load_jobs error: Invalid job id specified\n", err: exit1}, false, ""},
		{answer{errOut: "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", err: exit1}, false, "Unable to contact"},
	} {
		running, err := jobRunning("4711", ask(tc.a))
		if tc.err != "" {
			require.Error(t, err, "%+v", tc.a)
			assert.Contains(t, err.Error(), tc.err)
			continue
		}
		require.NoError(t, err, "%+v", tc.a)
		assert.Equal(t, tc.running, running, "%+v", tc.a)
	}
	assert.Equal(t, []string{"--noheader", "--states=all", "--jobs=4711", "--format=%T"}, asked)

	for _, bad := range []string{"", "-1", "--all", "12 34", "1_2", "12345678901"} {
		asked = nil
		_, err := jobRunning(bad, ask(answer{out: "RUNNING"}))
		assert.Error(t, err, bad)
		assert.Nil(t, asked, "%q never reaches squeue", bad)
	}
}
