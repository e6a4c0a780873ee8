package jobrun

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun/jobruntest"
)

// testRequest is a job on a host tree with hardware KVM (kvm_intel), 4
// CPUs and 8 GiB on one node, guest RAM on 4 KiB pages, so the host checks
// pass whatever this machine has and Run reaches IMAGE; the kernel is a
// synthetic bzImage of release 6.1.0-test, IMAGE a directory with /bin/sh,
// the agent jobruntest's stand-in, the caches the test's own.
func testRequest(t *testing.T, argv ...string) Request {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 8<<30)
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.KVM()
	tr.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	kernel := boottest.BzImage(nil, 0, 0)
	binary.LittleEndian.PutUint16(kernel[0x20e:], 0x200)
	copy(kernel[0x400:], "6.1.0-test (test@hpcvmm) #1 SMP\x00")
	kp := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kp, kernel, 0o644))
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/data"), []byte("x"), 0o644))
	cfg := vmm.DefaultConfig()
	cfg.SysfsRoot, cfg.ProcfsRoot = tr.Sys(), tr.Proc()
	cfg.HugePages, cfg.Memory, cfg.Kernel = guestmem.Page4K, 512<<20, kp
	cfg.KernelCache = filepath.Join(t.TempDir(), "kernels")
	return Request{Image: img, Argv: argv, VM: cfg, Contain: true, Agent: jobruntest.Agent(t, ProbeAnswer()),
		InitramfsCache: filepath.Join(t.TempDir(), "initramfs")}
}

// runError runs req and returns its *Error (failing when there is none).
func runError(t *testing.T, req Request) *Error {
	t.Helper()
	_, err := Run(context.Background(), req)
	var je *Error
	require.True(t, errors.As(err, &je), "an *Error: %v", err)
	if je.Kind != Host {
		assert.NotContains(t, je.Error(), "\n", "one line")
	}
	return je
}

// TestRunErrorKinds: a job that cannot run says who is at fault, before
// the VM exists: the request (Input), the host (Host), COMMAND not in
// IMAGE (NotFound) or not executable there (NotExecutable).
func TestRunErrorKinds(t *testing.T) {
	for _, c := range []struct {
		name string
		req  func(Request) Request
		kind Kind
		want string
	}{
		{"no COMMAND", func(r Request) Request { r.Argv = nil; return r }, Input, "no COMMAND"},
		{"relative workdir", func(r Request) Request { r.Workdir = "work"; return r }, Input, `--workdir "work"`},
		{"image and initrd", func(r Request) Request { r.VM.Initrd = r.VM.Kernel; return r }, Input, "--rootfs and --initrd"},
		{"bad module name", func(r Request) Request { r.Modules = []string{"fs/nfs.ko"}; return r }, Input, "--module"},
		{"no KVM", func(r Request) Request {
			tr := hosttest.New(t)
			tr.Node(0, "0-3", 8<<30)
			tr.CPUInfo(46)
			tr.Interrupts(true)
			r.VM.SysfsRoot, r.VM.ProcfsRoot = tr.Sys(), tr.Proc()
			return r
		}, Host, "the host cannot run this VM"},
		{"not found", func(r Request) Request { r.Argv = []string{"nosuch"}; return r }, NotFound, "nosuch"},
		{"not executable", func(r Request) Request { r.Argv = []string{"/bin/data"}; return r }, NotExecutable, "/bin/data"},
	} {
		je := runError(t, c.req(testRequest(t, "sh")))
		assert.Equal(t, c.kind, je.Kind, "%s: %v", c.name, je)
		assert.Contains(t, je.Error(), c.want, c.name)
	}
}

// TestRunRefusesANonAgent: an agent that does not answer the probe (a
// static program that prints something else) is refused before the
// initramfs is built: one line naming it, the request's fault, no
// archive cached.
func TestRunRefusesANonAgent(t *testing.T) {
	req := testRequest(t, "sh")
	req.Agent = jobruntest.Agent(t, "hello\n")
	je := runError(t, req)
	assert.Equal(t, Input, je.Kind)
	assert.Contains(t, je.Error(), "agent "+req.Agent+": not an hpcvmm agent")
	archives, err := filepath.Glob(filepath.Join(req.InitramfsCache, "*.cpio"))
	require.NoError(t, err)
	assert.Empty(t, archives)
}

// copyFile copies the host's file src to dst in an image, with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	require.NoError(t, os.WriteFile(dst, b, mode))
}

// TestRunLooksUpTheInterpreter is issue 35's "a dynamic COMMAND whose ELF
// interpreter is missing from the image passes the pre-boot check": with
// a real dynamic program (the host's /bin/true) in IMAGE and no
// /lib64/ld-linux-x86-64.so.2, the job is refused before boot with 127,
// one line naming COMMAND and the interpreter; an interpreter that is
// there but not executable is 126; with the interpreter (a symbolic link
// to the C library's loader, as Debian lays it out) the job gets past the
// check (to the VM, which this host tree cannot open: 125).
func TestRunLooksUpTheInterpreter(t *testing.T) {
	f, err := elf.Open("/bin/true")
	require.NoError(t, err)
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			require.NoError(t, err)
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	require.Equal(t, "/lib64/ld-linux-x86-64.so.2", interp, "the host's /bin/true: the test needs a dynamic x86-64 program")
	loader, err := filepath.EvalSymlinks(interp)
	require.NoError(t, err)

	req := testRequest(t, "true")
	copyFile(t, "/bin/true", filepath.Join(req.Image, "bin/true"), 0o755)
	je := runError(t, req)
	assert.Equal(t, NotFound, je.Kind, "%v", je)
	assert.Contains(t, je.Error(), "--rootfs "+req.Image+": command true (/bin/true) is dynamically linked and its ELF interpreter /lib64/ld-linux-x86-64.so.2 is not in the image")
	// COMMAND by its path names that path.
	req.Argv = []string{"/bin/true"}
	assert.Contains(t, runError(t, req).Error(), "command /bin/true is dynamically linked")

	inImage := filepath.Join(req.Image, filepath.FromSlash(loader))
	copyFile(t, loader, inImage, 0o644)
	require.NoError(t, os.MkdirAll(filepath.Join(req.Image, "lib64"), 0o755))
	require.NoError(t, os.Symlink(loader, filepath.Join(req.Image, "lib64/ld-linux-x86-64.so.2")))
	je = runError(t, req)
	assert.Equal(t, NotExecutable, je.Kind, "%v", je)
	assert.Contains(t, je.Error(), "is in the image but not executable")

	require.NoError(t, os.Chmod(inImage, 0o755))
	je = runError(t, req)
	assert.Equal(t, VMFailed, je.Kind, "past the pre-boot checks: %v", je)
}
