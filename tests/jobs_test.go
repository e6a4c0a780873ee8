//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// jobResult is one `hpcvmm run ... -- COMMAND` as its caller sees it.
type jobResult struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// jobArgs are the flags every job scenario boots with: the test bed's L2
// kernel, one vCPU, 512 MiB on 4 KiB pages.
func jobArgs(t *testing.T, env *harness.Env, extra ...string) []string {
	return env.VMArgs(append([]string{"run", "--kernel", env.L2Kernel(t), "--cpus", "1", "--memory", "512M", "--hugepages", "none"}, extra...))
}

// runJob runs hpcvmm with args, stdin and stdout as given (nil: empty
// input, captured output), and during runs while it does.
func runJob(t *testing.T, env *harness.Env, stdin io.Reader, stdout io.Writer, during func(cmd *exec.Cmd), args ...string) jobResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.HPCVMM(t), env.VMArgs(args)...)
	var out, errOut testenv.LockedBuffer
	cmd.Stdin = stdin
	cmd.Stdout = &out
	if stdout != nil {
		cmd.Stdout = stdout
	}
	cmd.Stderr = &errOut
	t0 := time.Now()
	require.NoError(t, cmd.Start())
	if during != nil {
		go during(cmd)
	}
	err := cmd.Wait()
	r := jobResult{stdout: out.String(), stderr: errOut.String(), code: cmd.ProcessState.ExitCode(), took: time.Since(t0)}
	if ctx.Err() != nil {
		t.Fatalf("hpcvmm %s did not end within 4m; stderr:\n%s", strings.Join(args, " "), r.stderr)
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("hpcvmm: %v", err)
	}
	t.Logf("hpcvmm %s: exit %d in %v", strings.Join(args[len(args)-min(4, len(args)):], " "), r.code, r.took.Round(time.Millisecond))
	return r
}

// busyboxRootfs is a directory IMAGE: L1's static busybox and a link for
// each of its applets in /bin.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	b, err := os.ReadFile("/bin/busybox")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755))
	for _, a := range busyboxApplets(t) {
		if a != "busybox" {
			require.NoError(t, os.Symlink("busybox", filepath.Join(dir, "bin", a)))
		}
	}
	return dir
}

func busyboxApplets(t *testing.T) []string {
	out, err := exec.Command("/bin/busybox", "--list").Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// TestJobsBusybox: `hpcvmm run --rootfs DIR -- COMMAND` on a busybox
// rootfs: streams apart, exit statuses, stdin to end of file, signals, the
// failures before and at exec, and the initramfs cache.
func TestJobsBusybox(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		root := busyboxRootfs(t)
		rootfs := func(extra ...string) []string {
			return jobArgs(t, env, append([]string{"--rootfs", root}, extra...)...)
		}

		t.Run("streams-and-status", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, rootfs("--", "sh", "-c", "echo out; echo err >&2; exit 7")...)
			assert.Equal(t, 7, r.code, "stderr:\n%s", r.stderr)
			assert.Equal(t, "out\n", r.stdout, "stdout holds COMMAND's stdout alone")
			assert.Contains(t, r.stderr, "err\n")
			assert.NotContains(t, r.stderr, "out\n")
			env.Record(t, "first_launch_ms", durMS(r.took))

			// --quiet: hpcvmm adds nothing of its own to stderr.
			r = runJob(t, env, nil, nil, nil, rootfs("--quiet", "--", "sh", "-c", "echo out; echo err >&2; exit 7")...)
			assert.Equal(t, 7, r.code)
			assert.Equal(t, "out\n", r.stdout)
			assert.Equal(t, "err\n", r.stderr)
		})

		t.Run("cache-hit", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, rootfs("--", "true")...)
			assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "initramfs cache hit", "the second launch of the same IMAGE builds nothing")
			assert.NotContains(t, r.stderr, "initramfs built")
			env.Record(t, "true_cache_hit_ms", durMS(r.took))
		})

		t.Run("16MiB-through-cat", func(t *testing.T) {
			data := make([]byte, 16<<20)
			_, _ = rand.Read(data)
			h := sha256.New()
			r := runJob(t, env, bytes.NewReader(data), h, nil, rootfs("--", "cat")...)
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			want := sha256.Sum256(data)
			assert.Equal(t, want[:], h.Sum(nil), "SHA-256 of stdin and of stdout")
			env.Record(t, "cat_16MiB_ms", durMS(r.took))
		})

		t.Run("killed-by-signal", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, rootfs("--", "sh", "-c", "kill -TERM $$")...)
			assert.Equal(t, 143, r.code, "stderr:\n%s", r.stderr)
		})

		t.Run("missing-command", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, rootfs("--", "no-such-command")...)
			assert.Equal(t, 127, r.code)
			assert.Contains(t, r.stderr, "no-such-command")
			assert.Contains(t, r.stderr, "not found")
		})

		t.Run("sigterm-reaches-trap", func(t *testing.T) {
			var out testenv.LockedBuffer
			r := runJob(t, env, nil, &out, func(cmd *exec.Cmd) {
				deadline := time.Now().Add(3 * time.Minute)
				for time.Now().Before(deadline) && !strings.Contains(out.String(), "ready") {
					time.Sleep(50 * time.Millisecond)
				}
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}, rootfs("--", "sh", "-c", `trap 'echo trapped; exit 0' TERM; echo ready; while :; do sleep 1; done`)...)
			assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Equal(t, "ready\ntrapped\n", out.String())
		})

		// A command that ignores SIGTERM: after --shutdown-timeout hpcvmm
		// presses the ACPI power button, the agent reads KEY_POWER and
		// sends SIGTERM, then SIGKILL after its grace: 137.
		t.Run("shutdown-timeout-power-button", func(t *testing.T) {
			var out testenv.LockedBuffer
			r := runJob(t, env, nil, &out, func(cmd *exec.Cmd) {
				deadline := time.Now().Add(3 * time.Minute)
				for time.Now().Before(deadline) && !strings.Contains(out.String(), "ready") {
					time.Sleep(50 * time.Millisecond)
				}
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}, rootfs("--shutdown-timeout", "3s", "--", "sh", "-c", `trap '' TERM; echo ready; while :; do sleep 1; done`)...)
			assert.Equal(t, 137, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "pressing the power button")
		})

		t.Run("dynamic-command-without-libc", func(t *testing.T) {
			dyn, err := exec.LookPath("nvme") // dynamic, in L1 with its libraries
			if err != nil {
				dyn = "/usr/sbin/nvme"
			}
			b, err := os.ReadFile(dyn)
			require.NoError(t, err, "a dynamically linked program in L1")
			require.NoError(t, os.WriteFile(filepath.Join(root, "bin/dyn"), b, 0o755))
			defer os.Remove(filepath.Join(root, "bin/dyn"))
			// Refused before boot since jobrun looks the interpreter up in
			// IMAGE as it looks COMMAND up (issue 35): 127, as execve's
			// ENOENT reads in a shell.
			r := runJob(t, env, nil, nil, nil, rootfs("--", "/bin/dyn", "version")...)
			assert.Equal(t, 127, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "ELF interpreter")
		})

		t.Run("env-workdir-user", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, rootfs("--env", "GREETING=hello", "--workdir", "/etc", "--user", "1000:100",
				"--", "sh", "-c", `echo "$GREETING $(pwd) $(id -u):$(id -g) $(cat /proc/1/comm)"`)...)
			assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Equal(t, "hello /etc 1000:100 hpcvmm-agent\n", r.stdout)
		})
	})
}

// TestJobsOCIWhiteout: an OCI image layout of two layers built here with
// go-containerregistry, the second deleting a file of the first: the file
// is absent in the guest, its neighbour present.
func TestJobsOCIWhiteout(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		dir := whiteoutOCI(t)
		r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", dir, "--",
			"sh", "-c", "test -e /etc/keep && echo keep-present; test -e /etc/secret && echo secret-present; exit 0")...)
		assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		assert.Equal(t, "keep-present\n", r.stdout, "the second layer's whiteout removed /etc/secret")
	})
}

// whiteoutOCI writes an OCI image layout of two layers: busybox with its
// applet links, /etc/secret and /etc/keep, then a whiteout of /etc/secret.
func whiteoutOCI(t *testing.T) string {
	bb, err := os.ReadFile("/bin/busybox")
	require.NoError(t, err)
	var l1 []tarEntry
	l1 = append(l1, tarEntry{name: "bin/", mode: 0o755, typ: tar.TypeDir}, tarEntry{name: "bin/busybox", mode: 0o755, data: bb},
		tarEntry{name: "etc/", mode: 0o755, typ: tar.TypeDir},
		tarEntry{name: "etc/secret", mode: 0o644, data: []byte("s")}, tarEntry{name: "etc/keep", mode: 0o644, data: []byte("k")})
	for _, a := range busyboxApplets(t) {
		if a != "busybox" {
			l1 = append(l1, tarEntry{name: "bin/" + a, typ: tar.TypeSymlink, link: "busybox"})
		}
	}
	l2 := []tarEntry{{name: "etc/.wh.secret", mode: 0o644}}
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, l1), tarLayer(t, l2))
	require.NoError(t, err)
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, p.AppendImage(img))
	return dir

}

type tarEntry struct {
	name string
	mode int64
	typ  byte
	data []byte
	link string
}

func tarLayer(t *testing.T, ents []tarEntry) v1.Layer {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Typeflag: typ, Size: int64(len(e.data)), Linkname: e.link}))
		_, err := tw.Write(e.data)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.Bytes())), nil })
	require.NoError(t, err)
	return l
}

func durMS(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// TestJobsDebianPython: a rootfs of Debian packages (busybox-static,
// python3-minimal and the libraries its interpreter needs), downloaded and
// unpacked by the test bed with apt-get download and dpkg -x: a dynamically
// linked python3 with the distribution's own libc runs and its exit status
// is hpcvmm's.
func TestJobsDebianPython(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", harness.JobsDebianRoot, "--",
			"python3", "-c", "import sys; print(sys.version); sys.exit(5)")...)
		assert.Equal(t, 5, r.code, "stderr:\n%s", r.stderr)
		assert.Regexp(t, `^3\.\d+\.\d+ `, r.stdout)
		env.Record(t, "python_version", strings.TrimSpace(r.stdout))
	})
}

// TestJobsOpenMPISingleton (issue 35: "an Open MPI singleton exits 0"):
// a rootfs of Debian's Open MPI runtime, unpacked by the test bed, and a
// program compiled against it, run as COMMAND without mpirun and without
// --net: MPI_Init starts its own orted, which reaches the program over the
// guest's loopback, and the program is rank 0 of 1. The job passes
// harness.OpenMPISingletonEnv (the launcher for a node without ssh) and
// gets HOME from the agent; ompi-hello is found in the default PATH
// (harness.OpenMPIHello).
func TestJobsOpenMPISingleton(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", harness.JobsOpenMPIRoot,
			"--env", harness.OpenMPISingletonEnv, "--", "ompi-hello")...)
		assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		assert.Equal(t, "rank 0 of 1\n", r.stdout, "stderr:\n%s", r.stderr)
	})
}

// TestJobsPassthrough: `--vf` (the NVMe VF stand-in) and `--gpu` (edu)
// with --rootfs: hpcvmm finds a device's driver by its modalias and puts
// it in the job's initramfs, and the command, a script of the busybox
// rootfs, drives the device and exits with the result: 1 MiB of random
// bytes written through the NVMe VF and read back past the page cache;
// edu's identity, its factorial unit and a DMA round trip guest RAM ->
// device -> guest RAM (the buffer hidden from the kernel with memmap=, as
// TestPassthroughDMA does).
func TestJobsPassthrough(t *testing.T) {
	harness.Run(t, harness.ProfileJobsPassthrough, func(t *testing.T, env *harness.Env) {
		root := busyboxRootfs(t)
		pt := func(extra ...string) []string {
			return append([]string{"run", "--kernel", env.L2Kernel(t), "--cpus", "1", "--memory", "1G", "--hugepages", "1G"}, extra...)
		}

		t.Run("nvme-vf", func(t *testing.T) {
			setDriver(t, harness.NVMeVFBDF, "vfio-pci")
			t.Cleanup(func() { setDriver(t, harness.NVMeVFBDF, "") })
			const script = `i=0
while ! ls /sys/block | grep -qE '^nvme[0-9]+n[0-9]+$'; do i=$((i+1)); [ $i -lt 600 ] || { echo no nvme block device >&2; exit 3; }; sleep 0.1; done
blk=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
dd if=/dev/urandom of=/tmp/out bs=1024 count=1024 2>/dev/null
dd if=/tmp/out of=/dev/$blk bs=1024 seek=2048 conv=fsync 2>/dev/null || exit 4
echo 3 > /proc/sys/vm/drop_caches
dd if=/dev/$blk of=/tmp/in bs=1024 skip=2048 count=1024 2>/dev/null || exit 5
echo "$blk $(sha256sum </tmp/out | cut -d' ' -f1) $(sha256sum </tmp/in | cut -d' ' -f1)"
cmp -s /tmp/out /tmp/in`
			r := runJob(t, env, nil, nil, nil, pt("--vf", harness.NVMeVFBDF, "--rootfs", root, "--", "sh", "-c", script)...)
			assert.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			f := strings.Fields(r.stdout)
			require.Len(t, f, 3, "stdout: %q", r.stdout)
			assert.Equal(t, f[1], f[2], "SHA-256 written and read back")
			assert.Contains(t, r.stderr, "module_source=", "hpcvmm logged the initramfs build and its modules")
			env.Record(t, "nvme_sha256", f[1])
		})

		t.Run("edu", func(t *testing.T) {
			setDriver(t, harness.EduBDF, "vfio-pci")
			t.Cleanup(func() { setDriver(t, harness.EduBDF, "") })
			script := fmt.Sprintf(`for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor):$(cat $d/device)" = 0x1234:0x11e8 ] && break; done
[ "$(cat $d/vendor)" = 0x1234 ] || { echo no edu >&2; exit 10; }
set -- $(sed -n 1p $d/resource); edu=$(($1))
lo=$(od -An -tu1 -j4 -N1 $d/config | tr -d ' ')
printf "$(printf '\\%%03o' $((lo | 6)))" | dd of=$d/config bs=1 seek=4 count=1 conv=notrunc 2>/dev/null
id=$(printf 0x%%08x $(devmem $edu 32))
devmem $((edu + 8)) 32 10
i=0; while [ $(($(devmem $((edu + 0x20)) 32) & 1)) -ne 0 ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.05; done
fact=$(($(devmem $((edu + 8)) 32)))
src=%#x dst=$((%#x + 0x1000)) words=16 seed=$((RANDOM * 65536 + RANDOM))
i=0; while [ $i -lt $words ]; do devmem $((src + 4 * i)) 32 $(((seed + i * 0x01010101) & 0xffffffff)); devmem $((dst + 4 * i)) 32 0; i=$((i + 1)); done
for step in "$src 0x40000 1" "0x40000 $dst 3"; do
	set -- $step
	devmem $((edu + 0x80)) 64 $(($1)); devmem $((edu + 0x88)) 64 $(($2)); devmem $((edu + 0x90)) 32 $((words * 4)); devmem $((edu + 0x98)) 32 $3
	i=0; while [ $(($(devmem $((edu + 0x98)) 32) & 1)) -ne 0 ]; do i=$((i + 1)); [ $i -le 200 ] || exit 11; sleep 0.05; done
done
good=0 i=0
while [ $i -lt $words ]; do [ $(($(devmem $((dst + 4 * i)) 32))) -eq $(((seed + i * 0x01010101) & 0xffffffff)) ] && good=$((good + 1)); i=$((i + 1)); done
echo "edu_id=$id factorial_10=$fact dma_words_matching=$good"
[ "$id" = 0x010000ed ] && [ "$fact" = 3628800 ] && [ "$good" = 16 ]`, eduDMABuf, eduDMABuf)
			r := runJob(t, env, nil, nil, nil, pt("--gpu", harness.EduBDF,
				"--cmdline", fmt.Sprintf("console=ttyS0 quiet reboot=k panic=-1 memmap=1M$%#x", eduDMABuf),
				"--rootfs", root, "--", "sh", "-c", script)...)
			assert.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			assert.Equal(t, "edu_id=0x010000ed factorial_10=3628800 dma_words_matching=16\n", r.stdout)
		})
	})
}

// TestJobsNet: `--net tap=...,bridge=BR,ip=...` with no script around
// hpcvmm: the TAP joins a bridge of L1, the agent configures the guest's
// interface, and the command (busybox wget) fetches a page from a listener
// on the bridge's address; then the same with ip=dhcp against Debian's
// dnsmasq on the bridge.
func TestJobsNet(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		const brName, brAddr = "brjob", "10.78.0.1"
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: brName}}
		require.NoError(t, netlink.LinkAdd(br))
		t.Cleanup(func() { _ = netlink.LinkDel(br) })
		a, err := netlink.ParseAddr(brAddr + "/24")
		require.NoError(t, err)
		require.NoError(t, netlink.AddrAdd(br, a))
		require.NoError(t, netlink.LinkSetUp(br))
		ln, err := net.Listen("tcp", brAddr+":8080")
		require.NoError(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "hello-job from "+r.RemoteAddr+"\n")
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })

		root := busyboxRootfs(t)
		script := "wget -q -O - http://" + brAddr + ":8080/"

		t.Run("static", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--net", "tap=tjob0,bridge="+brName+",ip=10.78.0.2/24,gw="+brAddr,
				"--rootfs", root, "--", "sh", "-c", script)...)
			assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Regexp(t, `^hello-job from 10\.78\.0\.2:\d+\n$`, r.stdout)
			_, err := netlink.LinkByName("tjob0")
			assert.Error(t, err, "the TAP hpcvmm created is gone")
		})

		t.Run("dhcp", func(t *testing.T) {
			if _, err := os.Stat("/etc/passwd"); err != nil { // dnsmasq -u root looks root up
				require.NoError(t, os.MkdirAll("/etc", 0o755))
				require.NoError(t, os.WriteFile("/etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644))
			}
			dir := t.TempDir()
			cmd := exec.Command("/usr/sbin/dnsmasq", "-k", "-u", "root", "-C", "/dev/null",
				"--interface="+brName, "--bind-interfaces", "--port=0", "--dhcp-authoritative",
				"--dhcp-range=10.78.0.50,10.78.0.59,255.255.255.0,2m", "--dhcp-option=option:router,"+brAddr,
				"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--pid-file="+filepath.Join(dir, "pid"),
				"--log-facility="+filepath.Join(dir, "log"), "--log-dhcp")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				if t.Failed() {
					log, _ := os.ReadFile(filepath.Join(dir, "log"))
					t.Logf("dnsmasq: %s\n%s", out.String(), log)
				}
			})
			require.Eventually(t, func() bool {
				b, _ := os.ReadFile(filepath.Join(dir, "log"))
				return bytes.Contains(b, []byte("DHCP, IP range"))
			}, 20*time.Second, 20*time.Millisecond, "dnsmasq did not start: %s", &out)

			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--net", "tap=tjob1,bridge="+brName+",ip=dhcp",
				"--rootfs", root, "--", "sh", "-c", script)...)
			assert.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			assert.Regexp(t, `^hello-job from 10\.78\.0\.5\d:\d+\n$`, r.stdout, "the guest's address is dnsmasq's lease")
			leases, _ := os.ReadFile(filepath.Join(dir, "leases"))
			assert.Contains(t, string(leases), "10.78.0.5")
		})
	})
}

// TestJobsTTY: hpcvmm's stdin a terminal (a pty here, 40x120): COMMAND gets
// a pty in the guest of that size, stdout and stderr both on it, and
// hpcvmm restores the terminal and exits with COMMAND's status.
// ensureDevpts mounts a devpts where there is none: L1's /init mounts no
// devpts, and /dev/ptmx opens the devpts beside it, so a terminal needs one.
func ensureDevpts(t *testing.T) {
	t.Helper()
	if mounts, _ := os.ReadFile("/proc/mounts"); !strings.Contains(string(mounts), " /dev/pts devpts ") {
		require.NoError(t, os.MkdirAll("/dev/pts", 0o755))
		require.NoError(t, unix.Mount("devpts", "/dev/pts", "devpts", 0, "ptmxmode=0666"))
	}
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		require.NoError(t, os.Symlink("pts/ptmx", "/dev/ptmx"))
	}
}

func TestJobsTTY(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		ensureDevpts(t)
		root := busyboxRootfs(t)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, env.HPCVMM(t), jobArgs(t, env, "--quiet", "--rootfs", root, "--",
			"sh", "-c", "tty; stty size; echo err >&2; exit 3")...)
		f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
		require.NoError(t, err)
		defer f.Close()
		var out testenv.LockedBuffer
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(&out, f); close(copied) }()
		err = cmd.Wait()
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatalf("hpcvmm: %v", err)
		}
		select {
		case <-copied:
		case <-time.After(5 * time.Second):
		}
		require.NoError(t, ctx.Err(), "hpcvmm did not end; output:\n%s", out.String())
		assert.Equal(t, 3, cmd.ProcessState.ExitCode(), "output:\n%s", out.String())
		assert.Regexp(t, `(?s)/dev/pts/\d+\r\n40 120\r\nerr\r\n`, out.String())
	})
}
