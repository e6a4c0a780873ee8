//go:build integration

package tests

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apptainer/sif/v2/pkg/sif"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// pmemBlobSize is the random (incompressible) data file each image holds,
// checked byte for byte from inside the guest.
const pmemBlobSize = 32 << 20

// TestJobsPMEMImage: `hpcvmm run --rootfs FILE.sqfs|.erofs|.sif` (issue
// 31). The image file is mapped read-only into the guest as persistent
// memory, the guest's nd_e820/nd_pmem make it /dev/pmem0, and the agent
// mounts it under a tmpfs overlay and switches root to it. From inside the
// guest: Debian's dynamically linked python3 runs from the SquashFS image
// and its status is the job's, a 32 MiB random file reads back with the
// host's SHA-256, the root is the overlay and writable, /dev/pmem0 is the
// image's size; an EROFS image and the SquashFS wrapped in a SIF boot the
// same way; a guest that writes to /dev/pmem0 past the page cache is
// refused and keeps running, and reads the image's own bytes back; an OCI
// layout is converted once with --rootfs-mode squashfs. From the host:
// hpcvmm logged the mapping, the refusal and the conversion's cache hit,
// and every image file is byte-identical afterwards.
func TestJobsPMEMImage(t *testing.T) {
	harness.Run(t, harness.ProfileJobs, func(t *testing.T, env *harness.Env) {
		dir := t.TempDir()
		blob := make([]byte, pmemBlobSize)
		_, err := rand.Read(blob)
		require.NoError(t, err)
		sum := sha256.Sum256(blob)
		wantSum := hex.EncodeToString(sum[:])

		// A SquashFS of Debian's python3 (the jobs profile's tree) plus
		// the data file, made with squashfs-tools as a site would.
		pyTree := filepath.Join(dir, "py")
		require.NoError(t, exec.Command("cp", "-a", harness.JobsDebianRoot, pyTree).Run())
		require.NoError(t, os.MkdirAll(filepath.Join(pyTree, "data"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pyTree, "data/blob"), blob, 0o644))
		pySqfs := filepath.Join(dir, "python.sqfs")
		t0 := time.Now()
		mustRun(t, "mksquashfs", pyTree, pySqfs, "-noappend", "-quiet", "-comp", "gzip")
		env.Record(t, "pmem_mksquashfs_ms", durMS(time.Since(t0)))

		// The busybox tree as EROFS and as SquashFS, and that SquashFS
		// wrapped in a SIF.
		bbTree := busyboxRootfs(t)
		require.NoError(t, os.MkdirAll(filepath.Join(bbTree, "data"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(bbTree, "data/blob"), blob, 0o644))
		bbErofs := filepath.Join(dir, "busybox.erofs")
		mustRun(t, "mkfs.erofs", "--quiet", bbErofs, bbTree)
		bbSqfs := filepath.Join(dir, "busybox.sqfs")
		mustRun(t, "mksquashfs", bbTree, bbSqfs, "-noappend", "-quiet")
		bbSIF := filepath.Join(dir, "busybox.sif")
		wrapSIF(t, bbSqfs, bbSIF)

		images := []string{pySqfs, bbErofs, bbSqfs, bbSIF}
		before := map[string]string{}
		for _, p := range images {
			before[p] = fileSHA256(t, p)
		}

		t.Run("squashfs-python", func(t *testing.T) {
			// The Debian root has busybox without its applet links:
			// busybox's shell runs the script. The write to /dev/pmem0 is
			// O_DIRECT, so it reaches nd_pmem's stores to the read-only
			// range, not only the page cache; after dropping the caches
			// the guest reads the image's own first bytes (SquashFS's
			// magic, "hsqs") again, and the VM runs on to python3.
			st, err := os.Stat(pySqfs)
			require.NoError(t, err)
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", pySqfs, "--", "busybox", "sh", "-c",
				`busybox sha256sum /data/blob; echo size=$(($(busybox cat /sys/block/pmem0/size) * 512)); `+
					`busybox awk '$2 == "/" {print "root=" $3}' /proc/mounts; echo w > /written && busybox cat /written; `+
					`busybox dd if=/dev/zero of=/dev/pmem0 bs=4096 count=1 oflag=direct 2>/dev/null; echo 3 > /proc/sys/vm/drop_caches; `+
					`busybox head -c 4 /dev/pmem0; echo; `+
					`exec python3 -c 'import sys; print(sys.version_info[0]); sys.exit(5)'`)...)
			assert.Equal(t, 5, r.code, "python3's status is the job's; stderr:\n%s", r.stderr)
			assert.Contains(t, r.stdout, wantSum+"  /data/blob\n", "the guest reads the host's bytes")
			assert.Contains(t, r.stdout, "root=overlay\n", "the job's root is the overlay over the image")
			assert.Contains(t, r.stdout, "w\nhsqs\n3\n", "the root is writable, the image's bytes are unchanged after the write, python3 ran")
			assert.Contains(t, r.stderr, "guest wrote to the read-only image (pmem)", "host side: the write was refused and logged")
			if _, size, ok := strings.Cut(r.stdout, "size="); assert.True(t, ok, "stdout: %s", r.stdout) {
				size, _, _ = strings.Cut(size, "\n")
				t.Logf("/dev/pmem0: %s bytes for a %d-byte image", size, st.Size())
			}
			assert.Contains(t, r.stderr, "IMAGE mapped read-only as persistent memory", "host side: hpcvmm mapped the image")
			assert.NotContains(t, r.stderr, "initramfs built job", "no tree of the image is packed")
			env.Record(t, "pmem_python_job_ms", durMS(r.took))
		})
		t.Run("erofs", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", bbErofs, "--", "sh", "-c",
				`sha256sum /data/blob; awk '$2 == "/" {print "root=" $3}' /proc/mounts; exit 7`)...)
			assert.Equal(t, 7, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stdout, wantSum+"  /data/blob\n")
			assert.Contains(t, r.stdout, "root=overlay\n")
			assert.Contains(t, r.stderr, "fs=erofs")
		})
		t.Run("sif", func(t *testing.T) {
			r := runJob(t, env, nil, nil, nil, jobArgs(t, env, "--rootfs", bbSIF, "--", "sh", "-c",
				`sha256sum /data/blob; exit 9`)...)
			assert.Equal(t, 9, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stdout, wantSum+"  /data/blob\n")
			assert.Contains(t, r.stderr, "container=sif")
		})
		t.Run("oci-converted", func(t *testing.T) {
			// --rootfs-mode squashfs: the OCI layout's flattened tree
			// (the second layer's whiteout applied) converted once into
			// the converted-image cache; the second launch converts
			// nothing.
			oci := whiteoutOCI(t)
			cache := filepath.Join(t.TempDir(), "images")
			args := jobArgs(t, env, "--rootfs", oci, "--rootfs-mode", "squashfs", "--image-cache", cache, "--",
				"sh", "-c", `test -e /etc/keep && echo keep-present; test -e /etc/secret && echo secret-present; awk '$2 == "/" {print "root=" $3}' /proc/mounts; exit 4`)
			r := runJob(t, env, nil, nil, nil, args...)
			assert.Equal(t, 4, r.code, "stderr:\n%s", r.stderr)
			assert.Equal(t, "keep-present\nroot=overlay\n", r.stdout, "the whiteout holds in the converted image")
			assert.Contains(t, r.stderr, "imagepack: converted", "host side: the first launch converted the image")
			assert.Contains(t, r.stderr, "IMAGE mapped read-only as persistent memory")
			sqfs, err := filepath.Glob(filepath.Join(cache, "*.sqfs"))
			require.NoError(t, err)
			require.Len(t, sqfs, 1, "one converted image in the cache")
			r = runJob(t, env, nil, nil, nil, args...)
			assert.Equal(t, 4, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "converted image cache hit", "the second launch converts nothing")
			assert.NotContains(t, r.stderr, "imagepack: converted")
			env.Record(t, "pmem_oci_warm_job_ms", durMS(r.took))
		})
		for _, p := range images {
			assert.Equal(t, before[p], fileSHA256(t, p), "%s is unchanged after the jobs", filepath.Base(p))
		}
	})
}

// mustRun runs a program of the test bed, failing with its output.
func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
}

// wrapSIF writes a SIF at out holding the SquashFS at sqfs as its primary
// system partition, as `apptainer build` lays one out.
func wrapSIF(t *testing.T, sqfs, out string) {
	t.Helper()
	b, err := os.ReadFile(sqfs)
	require.NoError(t, err)
	di, err := sif.NewDescriptorInput(sif.DataPartition, bytes.NewReader(b),
		sif.OptPartitionMetadata(sif.FsSquash, sif.PartPrimSys, "amd64"))
	require.NoError(t, err)
	f, err := sif.CreateContainerAtPath(out, sif.OptCreateWithDescriptors(di))
	require.NoError(t, err)
	require.NoError(t, f.UnloadContainer())
}

// fileSHA256 is the hex SHA-256 of the file at p.
func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
