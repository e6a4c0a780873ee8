package harness

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// Where says where a scenario body runs.
type Where string

const (
	// WhereHost: directly on the machine running go test.
	WhereHost Where = "host"
	// WhereInside: inside an L1 guest, as the scenario runner started by
	// L1's /init.
	WhereInside Where = "inside"
)

// Values of HPCVMM_TEST_WHERE.
const (
	modeAuto   = "auto"
	modeHost   = "host"
	modeL1     = "l1"
	modeInside = "inside"
)

// Env is what a scenario body gets: where it runs, the built artifacts, and
// ways to start hpcvmm and record observations. Methods that can fail take
// the calling test (or subtest) so they fail the right one.
type Env struct {
	where   Where
	profile Profile
	rec     *recorder // result port inside L1; nil on the host
}

// Where reports where the body runs.
func (e *Env) Where() Where { return e.where }

// Profile returns the profile the scenario asked for.
func (e *Env) Profile() Profile { return e.profile }

// Run runs a scenario body on a machine with KVM and the profile's devices:
// directly (host mode, or when already inside L1), or by booting L1 for the
// profile — once for all scenarios of that profile — and reporting the
// outcome the body had there as this test's outcome. In l1 mode the body
// does not run in this process at all; on failure Run prints the inner
// output and the tails of the L1 console, L2 console and hpcvmm log.
//
// Subtests created with t.Run inside the body appear in the inner output
// and in their result records; the outer test passes or fails as a whole.
func Run(t *testing.T, p Profile, body func(t *testing.T, env *Env)) {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("harness.Run: %v", err)
	}
	mode := os.Getenv("HPCVMM_TEST_WHERE")
	if mode == "" {
		mode = modeAuto
	}
	switch mode {
	case modeInside:
		runInside(t, p, body)
	case modeHost:
		if err := KVMUsable(); err != nil {
			skipOrFail(t, "HPCVMM_TEST_WHERE=host but %v", err)
		}
		if p.HostReady != nil {
			if err := p.HostReady(); err != nil {
				// Not turned into a failure: CI's l1 run covers profiles
				// whose devices a bare-metal host does not have.
				t.Skipf("profile %s cannot run on this host: %v (HPCVMM_TEST_WHERE=l1 runs it under QEMU)", p.Name, err)
			}
		}
		body(t, &Env{where: WhereHost, profile: p})
	case modeL1:
		runL1(t, p)
	case modeAuto:
		if err := hostReady(p); err != nil {
			t.Logf("running in L1 under QEMU: %v", err)
			runL1(t, p)
			return
		}
		body(t, &Env{where: WhereHost, profile: p})
	default:
		t.Fatalf("HPCVMM_TEST_WHERE=%q: want auto, host or l1 (inside is set by L1's /init)", mode)
	}
}

// Outer is what a RunOuter check gets on the outer side of an L1 boot.
type Outer struct {
	// RunDir is the L1 boot's run directory, holding the files the
	// profile's Prepare created (backing files of L1's devices).
	RunDir string
	// Records are the scenario's own Env.Record values (not its
	// subtests'), as recorded inside L1.
	Records map[string]string
}

// RunOuter is Run plus a check that runs outside L1 once the boot has
// ended and the scenario passed inside: it sees what only the outer side
// can, such as the files backing L1's emulated devices (what a guest
// wrote through a passed-through device into its backing file). In host
// mode there is no outer side: the body runs and outer does not.
func RunOuter(t *testing.T, p Profile, body func(t *testing.T, env *Env), outer func(t *testing.T, o Outer)) {
	t.Helper()
	mode := os.Getenv("HPCVMM_TEST_WHERE")
	l1 := mode == modeL1 || (mode == "" || mode == modeAuto) && hostReady(p) != nil
	Run(t, p, body)
	if !l1 || t.Failed() || t.Skipped() {
		return
	}
	r := l1RunOf(p)
	if r == nil || r.results == nil {
		t.Fatalf("RunOuter: no finished L1 boot of profile %s", p.Name)
	}
	o := Outer{RunDir: r.dir, Records: map[string]string{}}
	if tr := r.results.Tests[t.Name()]; tr != nil {
		for k, v := range tr.Values {
			o.Records[k] = v
		}
	}
	outer(t, o)
}

func hostReady(p Profile) error {
	if err := KVMUsable(); err != nil {
		return err
	}
	if p.HostReady != nil {
		return p.HostReady()
	}
	return nil
}

// KVMUsable checks that /dev/kvm opens, answers KVM_GET_API_VERSION with
// the one stable API version, and is hardware KVM: a kvm_pvm backend (as on
// some cloud VMs) runs real-mode code but cannot boot a stock kernel.
func KVMUsable() error {
	if host.New("/sys", "/proc").KVMBackend() == "kvm_pvm" {
		return fmt.Errorf("no usable /dev/kvm: it is kvm_pvm, which boots only PVM guest kernels")
	}
	s, err := uapi.OpenKVM()
	if err != nil {
		return fmt.Errorf("no usable /dev/kvm: %w", err)
	}
	defer s.Close()
	v, err := s.APIVersion()
	if err != nil {
		return fmt.Errorf("no usable /dev/kvm: %w", err)
	}
	if v != uapi.APIVersion {
		return fmt.Errorf("no usable /dev/kvm: KVM API version %d, want %d", v, uapi.APIVersion)
	}
	return nil
}

// requireIntegration reports whether CI asked for skips to be failures.
func requireIntegration() bool { return testenv.RequireIntegration() }

// skipOrFail skips with the reason, or fails when
// HPCVMM_REQUIRE_INTEGRATION=1 (testenv.SkipOrFail).
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.SkipOrFail(t, format, args...)
}

// runInside runs the body inside L1 and writes its outcome to the result
// port. Scenarios of other profiles skip without records: their own L1 boot
// runs them.
func runInside(t *testing.T, p Profile, body func(*testing.T, *Env)) {
	t.Helper()
	if cur := os.Getenv("HPCVMM_TEST_PROFILE"); cur != p.Name {
		t.Skipf("scenario of profile %s; this L1 boot is for profile %s", p.Name, cur)
	}
	rec := theRecorder()
	name := t.Name()
	if err := rec.write(Field{"test", name}, Field{"status", StatusRun}); err != nil {
		t.Fatalf("result port: %v", err)
	}
	// Registered first, so it runs after every cleanup the body registers
	// (those may still fail the test) and sees the final outcome.
	t.Cleanup(func() {
		status := StatusPass
		switch {
		case t.Failed():
			status = StatusFail
		case t.Skipped():
			status = StatusSkip
		}
		if err := rec.write(Field{"test", name}, Field{"status", status}); err != nil {
			t.Errorf("result port: %v", err)
		}
	})
	body(t, &Env{where: WhereInside, profile: p, rec: rec})
}

// Record notes an observation of the scenario (key=value). Inside L1 it is
// written to the result port, where the outer side shows it with the test's
// outcome; everywhere it is logged.
func (e *Env) Record(t testing.TB, key, value string) {
	t.Helper()
	t.Logf("record %s=%s", key, value)
	if e.rec == nil {
		return
	}
	if err := e.rec.write(Field{"test", t.Name()}, Field{"key", key}, Field{"value", value}); err != nil {
		t.Errorf("result port: %v", err)
	}
}

// recorder writes result records to the result port (/dev/ttyS1 inside L1).
type recorder struct {
	mu   sync.Mutex
	path string
	f    *os.File
	err  error
}

var (
	recOnce sync.Once
	rec     *recorder
)

func theRecorder() *recorder {
	recOnce.Do(func() {
		path := os.Getenv("HPCVMM_TEST_RESULTS")
		if path == "" {
			path = "/dev/ttyS1"
		}
		rec = &recorder{path: path}
		rec.f, rec.err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	})
	return rec
}

func (r *recorder) write(fields ...Field) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return fmt.Errorf("open %s: %w", r.path, r.err)
	}
	// One write per record so records never interleave.
	if _, err := r.f.WriteString(ResultPrefix + " " + FormatFields(fields...) + "\n"); err != nil {
		return fmt.Errorf("write %s: %w", r.path, err)
	}
	return nil
}

// Built artifacts in host mode, each built at most once per test binary.
var hostArtifacts struct {
	hpcvmmOnce, kernelOnce, l2Once sync.Once
	hpcvmm, l2Initrd               string
	kernel                         Kernel
	hpcvmmErr, kernelErr, l2Err    error
}

// HPCVMM returns the path of the static hpcvmm binary. On the host it is
// built on first use (so scenarios that do not need it never depend on
// cmd/hpcvmm building); inside L1 it is the copy packed into L1's
// initramfs. If it cannot be provided, t fails with the build error.
func (e *Env) HPCVMM(t testing.TB) string {
	t.Helper()
	if e.where == WhereInside {
		if p := os.Getenv("HPCVMM_TEST_HPCVMM"); p != "" {
			return p
		}
		why, _ := os.ReadFile(l1HPCVMMError)
		t.Fatalf("hpcvmm is not in this L1 image; building it on the outer side failed:\n%s", strings.TrimSpace(string(why)))
	}
	a := &hostArtifacts
	a.hpcvmmOnce.Do(func() {
		root, cache, err := rootAndCache()
		if err != nil {
			a.hpcvmmErr = err
			return
		}
		a.hpcvmm, a.hpcvmmErr = BuildHPCVMM(root, cache)
	})
	if a.hpcvmmErr != nil {
		t.Fatalf("building hpcvmm: %v", a.hpcvmmErr)
	}
	return a.hpcvmm
}

// L2Kernel returns the path of the L2 guest kernel: Debian's stock
// linux-image-amd64 bzImage, unmodified.
func (e *Env) L2Kernel(t testing.TB) string {
	t.Helper()
	if e.where == WhereInside {
		return envPath(t, "HPCVMM_TEST_L2_KERNEL")
	}
	return hostKernel(t).Image
}

// L2Initrd returns the path of the L2 initramfs (busybox, tests/guest/init,
// the guest's kernel modules).
func (e *Env) L2Initrd(t testing.TB) string {
	t.Helper()
	if e.where == WhereInside {
		return envPath(t, "HPCVMM_TEST_L2_INITRD")
	}
	k := hostKernel(t)
	a := &hostArtifacts
	a.l2Once.Do(func() {
		root, cache, err := rootAndCache()
		if err != nil {
			a.l2Err = err
			return
		}
		a.l2Initrd, a.l2Err = BuildL2Initrd(root, cache, k)
	})
	if a.l2Err != nil {
		t.Fatalf("building the L2 initramfs: %v", a.l2Err)
	}
	return a.l2Initrd
}

func hostKernel(t testing.TB) Kernel {
	t.Helper()
	a := &hostArtifacts
	a.kernelOnce.Do(func() {
		a.kernel, a.kernelErr = FindKernel()
		if a.kernelErr == nil {
			t.Logf("guest kernel: %s (%s)", a.kernel.Image, a.kernel.Reason)
		}
	})
	if a.kernelErr != nil {
		t.Fatalf("%v", a.kernelErr)
	}
	return a.kernel
}

func envPath(t testing.TB, name string) string {
	t.Helper()
	p := os.Getenv(name)
	if p == "" {
		t.Fatalf("%s is not set: L1's /init should have set it", name)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return p
}

func rootAndCache() (root, cache string, err error) {
	if root, err = ModuleRoot(); err != nil {
		return "", "", err
	}
	cache, err = CacheDir()
	return root, cache, err
}

// qemuPath finds qemu-system-x86_64.
func qemuPath() (string, error) {
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("qemu-system-x86_64 not found (%v); run tests/testbed-packages.sh (installs qemu-system-x86)", err)
	}
	return p, nil
}
