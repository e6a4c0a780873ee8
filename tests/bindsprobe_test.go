//go:build integration

package tests

import (
	"testing"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

func TestJobsBindsProbe(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		root := busyboxRootfs(t)
		src := userDir(t, 0o755, 0)
		r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", root, "--contain", "-B", src+":/data", "--",
			"sh", "-c", `t0=$(date +%s); dd if=/dev/zero of=/data/z64 bs=1M count=64 2>&1 | tail -1; t1=$(date +%s); echo "zero64 $((t1-t0)) s"; i=0; while [ $i -lt 64 ]; do dd if=/dev/urandom of=/data/big bs=1M count=1 seek=$i conv=notrunc 2>/dev/null || echo "dd $i failed"; i=$((i+1)); [ $((i % 8)) = 0 ] && echo "chunk $i $(date +%s)"; done; sha256sum /data/big; echo done $(date +%s)`)...)
		t.Logf("code %d\nstdout:\n%s\nstderr tail:\n%s", r.code, r.stdout, harness.Tail(r.stderr, 5))
	})
}
