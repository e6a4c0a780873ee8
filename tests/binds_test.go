//go:build integration

package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The unprivileged user of the binds scenarios: a uid and gid made up by
// the test (no passwd entry, as with a directory service a static binary
// cannot ask), and the group /dev/kvm is given to for the scenario, as a
// node's udev rules give it to group kvm.
const (
	jobUID = 4242
	jobGID = 4242
	kvmGID = 4243
)

// TestJobsBinds: host directories in a job (issue 37), proved from inside
// the guest (what COMMAND sees and prints) and from the host (the files
// hpcvmm's file server left, their owners, what stayed untouched).
func TestJobsBinds(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		root := busyboxRootfs(t)
		// The unprivileged user reads it too (t.TempDir's parent is 0700).
		require.NoError(t, os.Chmod(filepath.Dir(root), 0o755))
		require.NoError(t, os.Chmod(root, 0o755))

		t.Run("as-user-cwd-and-home", func(t *testing.T) {
			if env.Where() != harness.WhereInside {
				t.Skip("changes /dev/kvm's group: only inside the disposable L1")
			}
			giveKVMToGroup(t, kvmGID)
			base := userDir(t, 0o755, 0)
			home := filepath.Join(base, "home")
			run := filepath.Join(base, "project", "run")
			for _, d := range []string{home, run} {
				require.NoError(t, os.MkdirAll(d, 0o755))
				require.NoError(t, os.Chown(d, jobUID, jobGID))
			}
			in := "input deck " + time.Now().Format(time.RFC3339Nano) + "\n"
			require.NoError(t, os.WriteFile(filepath.Join(run, "in.txt"), []byte(in), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(home, ".rc"), []byte("home file\n"), 0o644))

			r := runJobAs(t, env, run, []string{"HOME=" + home, "USER=hpcjob"}, jobArgs(t, env, "--rootfs", root, "--",
				"sh", "-c", `cat in.txt > out.txt; id -u; id -g; id -un; ls -ln out.txt; pwd; cat "$HOME/.rc"`)...)
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			require.Len(t, lines, 6, "stdout:\n%s", r.stdout)
			assert.Equal(t, "4242", lines[0], "COMMAND's uid is hpcvmm's")
			assert.Equal(t, "4242", lines[1], "COMMAND's gid is hpcvmm's")
			assert.Equal(t, "hpcjob", lines[2], "the guest's passwd names the user")
			assert.Regexp(t, `^-\S+\s+\d+\s+4242\s+4242\s+`+itoa(len(in))+`\s.*out.txt$`, lines[3], "the guest sees the file it made as the user's")
			assert.Equal(t, run, lines[4], "the working directory is the host's, bound at its path")
			assert.Equal(t, "home file", lines[5], "$HOME is bound at its path")

			out := filepath.Join(run, "out.txt")
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			assert.Equal(t, in, string(b), "out.txt on the host holds in.txt's content")
			st, err := os.Stat(out)
			require.NoError(t, err)
			assert.Equal(t, uint32(jobUID), st.Sys().(*syscall.Stat_t).Uid, "out.txt on the host is the user's")
			assert.Equal(t, uint32(jobGID), st.Sys().(*syscall.Stat_t).Gid)
			env.Record(t, "as_user_took_ms", itoa(int(r.took.Milliseconds())))
		})

		t.Run("read-only", func(t *testing.T) {
			src := userDir(t, 0o755, 0)
			require.NoError(t, os.WriteFile(filepath.Join(src, "in"), []byte("kept\n"), 0o644))
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", root, "--contain", "--bind", src+":/data:ro", "--",
				"sh", "-c", `echo changed > /data/in; echo "write=$?"; touch /data/new; echo "create=$?"; cat /data/in`)...)
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stdout, "write=1\n")
			assert.Contains(t, r.stdout, "create=1\n")
			assert.Contains(t, r.stdout, "kept\n")
			assert.Contains(t, r.stderr, "Read-only file system", "the guest's writes fail with EROFS")
			b, err := os.ReadFile(filepath.Join(src, "in"))
			require.NoError(t, err)
			assert.Equal(t, "kept\n", string(b), "the host file is unchanged")
			_, err = os.Stat(filepath.Join(src, "new"))
			assert.True(t, os.IsNotExist(err), "nothing was created on the host")
		})

		t.Run("write-64MiB", func(t *testing.T) {
			src := userDir(t, 0o755, 0)
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", root, "--contain", "-B", src+":/data", "--",
				"sh", "-c", `t0=$(date +%s); dd if=/dev/urandom of=/data/big bs=1M count=64 2>/dev/null || exit 9; t1=$(date +%s); cat /data/big | sha256sum; t2=$(date +%s); echo "dd_s=$((t1-t0)) sha256sum_s=$((t2-t1))" >&2`)...)
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			for _, l := range strings.Split(r.stderr, "\n") {
				if strings.HasPrefix(l, "dd_s=") {
					t.Logf("guest timing: %s", l)
				}
			}
			guestSum := strings.Fields(r.stdout)
			require.NotEmpty(t, guestSum, "stdout: %q", r.stdout)
			f, err := os.Open(filepath.Join(src, "big"))
			require.NoError(t, err)
			defer f.Close()
			h := sha256.New()
			n, err := io.Copy(h, f)
			require.NoError(t, err)
			assert.Equal(t, int64(64<<20), n, "the whole file is on the host once hpcvmm exited")
			assert.Equal(t, guestSum[0], hex.EncodeToString(h.Sum(nil)), "the host's SHA-256 is the guest's")
			env.Record(t, "write_64mib_took_ms", itoa(int(r.took.Milliseconds())))
		})

		t.Run("confinement", func(t *testing.T) { bindConfinement(t, env, root) })

		// Issue 35: a job without --net still has its loopback interface
		// up: a listener on 127.0.0.1 in the guest is reachable.
		t.Run("loopback-without-net", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", root, "--contain", "--",
				"sh", "-c", `nc -l -p 5000 >/tmp/got & sleep 1; echo over-loopback | nc -w 5 127.0.0.1 5000; wait; cat /tmp/got`)...)
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Equal(t, "over-loopback\n", r.stdout)
		})
	})
}

// bindConfinement: from inside the guest, no way out of a bind's source:
// links the guest makes (absolute, relative, to /), `..` at the bind's root,
// a hard link to a file outside, mknod, and a directory the host swaps for a
// symbolic link to outside while the guest walks through it. Nothing
// outside is read or changed, and hpcvmm logs the refusals.
func bindConfinement(t *testing.T, env *harness.Env, root string) {
	base := userDir(t, 0o755, 0)
	src := filepath.Join(base, "src")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(src, "d"), outside} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(src, "d", "f"), []byte("inside\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "f"), []byte("TOPSECRET\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(base, "marker-above-src"), []byte("TOPSECRET\n"), 0o644))
	require.NoError(t, os.Symlink(outside, filepath.Join(src, "swap")))
	before := treeDigest(t, outside) + treeDigest(t, filepath.Join(base, "marker-above-src"))

	// The host swaps src/d and src/swap (a link to outside) for as long as
	// the guest walks, so each walk of d/f may meet either.
	stop := make(chan struct{})
	var swaps atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, filepath.Join(src, "d"), unix.AT_FDCWD, filepath.Join(src, "swap"), unix.RENAME_EXCHANGE) == nil {
				swaps.Add(1)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	script := strings.Join([]string{
		`ln -s / /data/escape; cat /data/escape` + base + `/outside/f; echo "root-link=$?"`,
		`ln -s ` + outside + ` /data/abs; cat /data/abs/f; echo "abs-link=$?"`,
		`ln -s ../outside /data/rel; cat /data/rel/f; echo "rel-link=$?"`,
		`cat /data/../marker-above-src; echo "dotdot=$?"`,
		`ln /bin/busybox /data/hard; echo "hardlink=$?"`,
		`mknod /data/null c 1 3; echo "mknod=$?"`,
		`mkfifo /data/fifo; echo "mkfifo=$?"`,
		// Shell builtins only (no fork per walk: L2 runs under an emulated L1).
		`i=0; while [ $i -lt 300 ]; do read -r a </data/d/f && echo "$a"; read -r b </data/swap/f && echo "$b"; i=$((i+1)); done 2>/dev/null | sort | uniq -c`,
	}, "\n")
	r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", root, "--contain", "-B", src+":/data", "--", "sh", "-c", script)...)
	close(stop)
	<-done
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	t.Logf("guest:\n%s", r.stdout)
	for _, want := range []string{"root-link=1", "abs-link=1", "rel-link=1", "dotdot=1", "hardlink=1", "mknod=1", "mkfifo=1"} {
		assert.Contains(t, r.stdout, want+"\n")
	}
	assert.NotContains(t, r.stdout, "TOPSECRET", "nothing outside the bind's source reached the guest")
	assert.Contains(t, r.stdout, "inside", "the walks that met the directory read its file")
	assert.Greater(t, swaps.Load(), int64(100), "the host swapped the directory while the guest walked")
	assert.Equal(t, before, treeDigest(t, outside)+treeDigest(t, filepath.Join(base, "marker-above-src")), "nothing outside changed")
	for _, l := range []string{"escape", "abs", "rel"} {
		fi, err := os.Lstat(filepath.Join(src, l))
		require.NoError(t, err, "the guest's link %s is in the source, as a link", l)
		assert.Equal(t, os.ModeSymlink, fi.Mode().Type())
	}
	for _, n := range []string{"null", "fifo", "hard"} {
		_, err := os.Lstat(filepath.Join(src, n))
		assert.True(t, os.IsNotExist(err), "%s was not made on the host", n)
	}
	assert.Contains(t, r.stderr, "refused", "hpcvmm logs what the file server refused")
	env.Record(t, "confinement_swaps", itoa(int(swaps.Load())))
}

// runJobAs runs hpcvmm as the scenario's unprivileged user (uid jobUID in
// group kvmGID) in dir, with env added to a minimal environment.
func runJobAs(t *testing.T, env *harness.Env, dir string, extraEnv []string, args ...string) jobResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.HPCVMM(t), env.VMArgs(args)...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}, extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: jobUID, Gid: jobGID, Groups: []uint32{kvmGID}}}
	var out, errOut testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	t0 := time.Now()
	err := cmd.Run()
	r := jobResult{stdout: out.String(), stderr: errOut.String(), took: time.Since(t0)}
	if ctx.Err() != nil {
		t.Fatalf("hpcvmm as uid %d did not end within 4m; stderr:\n%s", jobUID, r.stderr)
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("hpcvmm: %v", err)
	}
	r.code = cmd.ProcessState.ExitCode()
	t.Logf("hpcvmm as uid %d: exit %d in %v", jobUID, r.code, r.took.Round(time.Millisecond))
	return r
}

// giveKVMToGroup makes /dev/kvm rw for group gid (as udev's kvm rule does
// on a node) for the scenario.
func giveKVMToGroup(t *testing.T, gid int) {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat("/dev/kvm", &st))
	require.NoError(t, os.Chown("/dev/kvm", 0, gid))
	require.NoError(t, os.Chmod("/dev/kvm", 0o660))
	t.Cleanup(func() {
		_ = os.Chown("/dev/kvm", int(st.Uid), int(st.Gid))
		_ = os.Chmod("/dev/kvm", os.FileMode(st.Mode&0o777))
	})
}

// userDir is a fresh directory of mode under a path every user can reach,
// owned by uid.
func userDir(t *testing.T, mode os.FileMode, uid int) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "hpcvmm-binds-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	require.NoError(t, os.Chmod(d, mode))
	require.NoError(t, os.Chown(d, uid, uid))
	return d
}

// treeDigest is the SHA-256 of every name, mode, size, mtime and content
// under p.
func treeDigest(t *testing.T, p string) string {
	t.Helper()
	h := sha256.New()
	require.NoError(t, filepath.Walk(p, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		io.WriteString(h, path+"|"+fi.Mode().String()+"|"+itoa(int(fi.Size()))+"|"+fi.ModTime().String()+"\n")
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	}))
	return hex.EncodeToString(h.Sum(nil))
}
