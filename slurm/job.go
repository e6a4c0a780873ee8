package slurm

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// ValidJobID reports whether id is a Slurm job ID as SLURM_JOB_ID holds it:
// decimal digits only (at most 10: Slurm's IDs are 32-bit). Anything else
// is never passed to a Slurm command.
func ValidJobID(id string) bool {
	if id == "" || len(id) > 10 {
		return false
	}
	for _, c := range id {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// endedStates are the job states (squeue's %T) after which a job's
// allocation is gone for good. Every other state, COMPLETING included (the
// job's Epilog still runs), counts as running, as does a state this list
// does not know: a job is only treated as ended when Slurm says so.
var endedStates = map[string]bool{
	"BOOT_FAIL": true, "CANCELLED": true, "COMPLETED": true, "DEADLINE": true, "FAILED": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "PREEMPTED": true, "TIMEOUT": true, "REVOKED": true,
}

// JobRunning reports whether Slurm still runs job id: it asks
// `squeue --noheader --states=all --jobs=ID --format=%T`, which prints only
// the state (no field a user chooses, such as the job's name). A job squeue
// no longer knows ("Invalid job id specified": purged from slurmctld after
// MinJobAge) or in an ended state is not running. Any other failure
// (slurmctld unreachable, no squeue) is an error: the caller cannot tell.
func JobRunning(id string) (bool, error) {
	return jobRunning(id, func(args ...string) ([]byte, []byte, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("squeue", args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.Bytes(), stderr.Bytes(), err
	})
}

func jobRunning(id string, squeue func(args ...string) (stdout, stderr []byte, err error)) (bool, error) {
	if !ValidJobID(id) {
		return false, fmt.Errorf("slurm: %q is not a job ID", id)
	}
	out, errOut, err := squeue("--noheader", "--states=all", "--jobs="+id, "--format=%T")
	if err != nil {
		if bytes.Contains(errOut, []byte("Invalid job id")) {
			return false, nil
		}
		msg := strings.TrimSpace(string(errOut))
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		return false, fmt.Errorf("slurm: squeue --jobs=%s: %v: %s", id, err, msg)
	}
	return JobStatesRunning(string(out)), nil
}

// JobStatesRunning reports whether squeue's %T lines for one job (an array
// or heterogeneous job prints one per component) say it still runs: any
// state not known to be final. No line (the job is no longer listed) means
// it does not.
func JobStatesRunning(out string) bool {
	for _, s := range strings.Fields(out) {
		if !endedStates[s] {
			return true
		}
	}
	return false
}
