package net

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

// fakeVhost records what the device tells a vhost-net instance.
type fakeVhost struct {
	mu       sync.Mutex
	owner    bool
	features uint64
	num      [2]uint32
	base     [2]uint32
	kick     [2]int
	call     [2]int
	calls    []string // SetVringCall history, "index:fd"
	backend  [2]int
	closed   bool
	onOwner  func() // runs inside SetOwner, as the kernel starts the worker
}

func (f *fakeVhost) SetOwner() error {
	f.owner = true
	if f.onOwner != nil {
		f.onOwner()
	}
	return nil
}
func (f *fakeVhost) SetFeatures(x uint64) error                  { f.features = x; return nil }
func (f *fakeVhost) SetMemTable(r []uapi.VhostRegion) error      { return nil }
func (f *fakeVhost) SetVringNum(i, n uint32) error               { f.num[i] = n; return nil }
func (f *fakeVhost) SetVringBase(i, b uint32) error              { f.base[i] = b; return nil }
func (f *fakeVhost) SetVringAddr(i uint32, d, a, u []byte) error { return nil }
func (f *fakeVhost) SetVringKick(i uint32, fd int) error         { f.kick[i] = fd; return nil }
func (f *fakeVhost) SetBackend(i uint32, fd int) error           { f.backend[i] = fd; return nil }
func (f *fakeVhost) Close() error                                { f.closed = true; return nil }
func (f *fakeVhost) SetVringCall(i uint32, fd int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("closed")
	}
	f.call[i] = fd
	f.calls = append(f.calls, fmt.Sprintf("%d:%d", i, fd))
	return nil
}

func (f *fakeVhost) history() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// bootVhostDevice brings up a one-pair device on the vhost path with a
// fakeVhost, as Linux's virtio_net does: vector 0 for config, q+1 for q.
func bootVhostDevice(t *testing.T, tweak ...func(*Device, *fakeVhost)) (*transporttest.Rig, *Device, *fakeVhost, *sockBackend) {
	be := newSockBackend(t, 1)
	mem := make(queuetest.Memory, 8<<20)
	dev, err := New(be, Options{Name: "vh0", Vhost: VhostOff, Memory: mem,
		Regions: []uapi.VhostRegion{{GPA: 0, Data: mem}}})
	require.NoError(t, err)
	fake := &fakeVhost{kick: [2]int{-1, -1}, call: [2]int{-1, -1}, backend: [2]int{-1, -1}}
	dev.vhost, dev.why = true, ""
	dev.openVhost = func() (vhostNet, error) { return fake, nil }
	for _, f := range tweak {
		f(dev, fake)
	}
	rig, err := transporttest.NewRig(dev, mem)
	require.NoError(t, err)
	t.Cleanup(func() { rig.T.Close() })
	rig.EnableMSIX(3)
	_, status := rig.Negotiate(FeatureMrgRxbuf | FeatureCsum | FeatureGuestCsum | FeatureGuestTSO4 | FeatureHostTSO4 |
		virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc)
	require.NotZero(t, status&virtio.StatusFeaturesOK)
	require.Equal(t, uint16(0), rig.SetConfigVector(0))
	for q := 0; q < 2; q++ {
		d := queuetest.NewDriver(mem, 64, 0x10000*uint64(q+1))
		require.Equal(t, uint16(q+1), rig.SetupQueue(q, d, uint16(q+1)))
	}
	rig.DriverOK()
	require.Zero(t, rig.Status()&virtio.StatusNeedsReset)
	return rig, dev, fake, be
}

// setQueueVector writes queue_select and queue_msix_vector as the driver
// does (vp_modern_queue_vector) and returns the vector read back.
func setQueueVector(r *transporttest.Rig, q int, vec uint16) uint16 {
	r.Write(r.Common+22, 2, uint64(q))
	r.Write(r.Common+26, 2, uint64(vec))
	return uint16(r.Read(r.Common+26, 2))
}

func TestVhostSetup(t *testing.T) {
	rig, _, fake, be := bootVhostDevice(t)
	assert.True(t, fake.owner)
	assert.Equal(t, FeatureMrgRxbuf|virtio.FeatureVersion1|virtio.FeatureEventIdx|virtio.FeatureIndirectDesc, fake.features,
		"vhost hears the ring and header-layout features the driver took, offloads stay between the guest and the TAP")
	assert.Zero(t, fake.features&uapi.VhostNetFVirtioNetHdr, "the TAP carries the virtio-net header (TUNSETVNETHDRSZ), not vhost")
	assert.Equal(t, [2]uint32{64, 64}, fake.num)
	assert.Equal(t, [2]uint32{0, 0}, fake.base)
	assert.Equal(t, [2]int{rig.T.NotifyEventFD(0), rig.T.NotifyEventFD(1)}, fake.kick)
	irq := rig.T.IRQFDs()
	assert.Equal(t, [2]int{irq.EventFD(1), irq.EventFD(2)}, fake.call, "call eventfds are the vectors' KVM irqfds")
	assert.Equal(t, [2]int{be.fds[0], be.fds[0]}, fake.backend)
	assert.Equal(t, uint32(uapi.TunFCsum|uapi.TunFTSO4), be.offload.Load())
}

func TestVhostFollowsQueueVector(t *testing.T) {
	rig, dev, fake, _ := bootVhostDevice(t)
	irq := rig.T.IRQFDs()
	start := len(fake.history())

	// The driver moves the transmit queue onto the config vector (as
	// vp_find_vqs does when it falls back to shared vectors).
	require.Equal(t, uint16(0), setQueueVector(rig, 1, 0))
	assert.Equal(t, []string{fmt.Sprintf("1:%d", irq.EventFD(0))}, fake.history()[start:])
	assert.Equal(t, irq.EventFD(0), dev.fds[1].Call)

	// Writing the same vector again changes nothing.
	setQueueVector(rig, 1, 0)
	assert.Len(t, fake.history(), start+1)

	// VIRTIO_MSI_NO_VECTOR: no interrupts for the queue, so no call fd.
	require.Equal(t, uint16(virtio.NoVector), setQueueVector(rig, 1, virtio.NoVector))
	assert.Equal(t, "1:-1", fake.history()[start+1])
	// A vector beyond the table reads back as NO_VECTOR and is the same.
	require.Equal(t, uint16(virtio.NoVector), setQueueVector(rig, 1, 7))
	assert.Len(t, fake.history(), start+2)

	// The receive queue moves too, and back to a vector of its own.
	setQueueVector(rig, 0, 2)
	setQueueVector(rig, 1, 1)
	assert.Equal(t, []string{fmt.Sprintf("0:%d", irq.EventFD(2)), fmt.Sprintf("1:%d", irq.EventFD(1))}, fake.history()[start+2:])
	assert.Equal(t, [2]int{irq.EventFD(2), irq.EventFD(1)}, fake.call)

	// After a reset vhost is gone; vector writes reach nothing.
	rig.SetStatus(0)
	assert.True(t, fake.closed)
	n := len(fake.history())
	setQueueVector(rig, 0, 1)
	assert.Len(t, fake.history(), n)
	select {
	case err := <-rig.Errors:
		t.Fatalf("unexpected error: %v", err)
	default:
	}
}

// TestVhostWorkerPlacement: the worker thread VHOST_SET_OWNER starts
// ("vhost-<tid>", a kthread before Linux 6.4, a thread of this process
// from 6.4) is moved onto WorkerCPUs; an older worker of the same name
// and other tasks are left alone.
func TestVhostWorkerPlacement(t *testing.T) {
	// DriverOK runs Activate on this goroutine: keep it on one thread so
	// the test knows the worker's name.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	name := "vhost-" + strconv.Itoa(unix.Gettid())
	root := t.TempDir()
	task := func(dir, comm string) {
		require.NoError(t, os.MkdirAll(filepath.Join(root, dir), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, dir, "comm"), []byte(comm+"\n"), 0o644))
	}
	// A kernel thread's stat: PF_KTHREAD (0x200000) in field 9, after a
	// name with a space and a parenthesis.
	kthread := func(dir string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, dir, "stat"), []byte(dir+" (vhost x) S 2 0 0 0 -1 2129984 0 0\n"), 0o644))
	}
	user := func(dir string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, dir, "stat"), []byte(dir+" (vhost) S 1 1 1 0 -1 4194560 0 0\n"), 0o644))
	}
	task("150", name) // an earlier instance's worker
	kthread("150")
	task("151", "vhost-1") // another owner's worker
	kthread("151")
	task("self/task/7", "vcpu0") // one of our threads
	placed := map[int][]int{}
	rig, _, fake, _ := bootVhostDevice(t, func(d *Device, f *fakeVhost) {
		d.opts.WorkerCPUs = []int{2, 3}
		d.procRoot = root
		d.setAffinity = func(tid int, cpus []int) error { placed[tid] = cpus; return nil }
		f.onOwner = func() {
			task("self/task/300", name) // as from Linux 6.4
			// Another user's process that named itself after the
			// worker: not a kernel thread, not ours, never moved.
			task("500", name)
			user("500")
		}
	})
	assert.True(t, fake.owner)
	assert.Equal(t, map[int][]int{300: {2, 3}}, placed)

	// A second activation (after a reset) finds its own new worker, a
	// kthread this time (before Linux 6.4).
	clear(placed)
	fake.onOwner = func() { task("400", name); kthread("400") }
	_, st := rig.Negotiate(virtio.FeatureVersion1) // resets: vhost closed
	require.NotZero(t, st&virtio.StatusFeaturesOK)
	require.True(t, fake.closed)
	fake.closed = false // the same recorder stands in for the next instance
	mem := rig.Mem
	for q := 0; q < 2; q++ {
		rig.SetupQueue(q, queuetest.NewDriver(mem, 64, 0x10000*uint64(q+1)), uint16(q+1))
	}
	rig.DriverOK()
	select {
	case err := <-rig.Errors:
		t.Fatal(err)
	default:
	}
	require.Zero(t, rig.Status()&virtio.StatusNeedsReset)
	assert.Equal(t, map[int][]int{400: {2, 3}}, placed)
}

// TestVhostWorkerNotFound: without a worker to find (an unexpected kernel)
// the device still runs, and says why the placement did not happen.
func TestVhostWorkerNotFound(t *testing.T) {
	var reported []error
	rig, _, fake, _ := bootVhostDevice(t, func(d *Device, f *fakeVhost) {
		d.opts.WorkerCPUs = []int{1}
		d.opts.OnError = func(err error) { reported = append(reported, err) }
		d.procRoot = t.TempDir()
		d.setAffinity = func(int, []int) error { t.Error("nothing to place"); return nil }
	})
	assert.True(t, fake.owner)
	assert.Zero(t, rig.Status()&virtio.StatusNeedsReset)
	require.Len(t, reported, 1)
	assert.ErrorContains(t, reported[0], "no vhost worker thread")
}
