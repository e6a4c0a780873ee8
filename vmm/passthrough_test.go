package vmm

import (
	"bytes"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/iommu"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vfio"
)

// slowBackend is an IOMMU backend whose MapDMA takes delay.
type slowBackend struct{ delay time.Duration }

func (b slowBackend) IOMMUInfo() (uapi.VFIOIOMMUInfo, error)  { return uapi.VFIOIOMMUInfo{}, nil }
func (b slowBackend) MapDMA(uint64, []byte, uint32) error     { time.Sleep(b.delay); return nil }
func (b slowBackend) UnmapDMA(_, size uint64) (uint64, error) { return size, nil }
func (b slowBackend) Close() error                            { return nil }

func TestP2PLoggerLogsEveryMappingAndWarnsWhenSlow(t *testing.T) {
	for _, tc := range []struct {
		name string
		slow time.Duration
		warn bool
	}{{"fast", time.Hour, false}, {"slow", time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctr, err := iommu.NewWithBackend(slowBackend{delay: 2 * time.Millisecond})
			require.NoError(t, err)
			var buf bytes.Buffer
			p := p2pLogger{ctr: ctr, log: slog.New(slog.NewTextHandler(&buf, nil)), slow: tc.slow}
			require.NoError(t, p.MapBAR(64<<30, make([]byte, 8192), "00:06.0 BAR2"))
			out := buf.String()
			assert.Contains(t, out, `msg="DMA mapping" kind=BAR name="00:06.0 BAR2" iova=0x1000000000 size=8192 took=`)
			assert.Equal(t, tc.warn, bytes.Contains(buf.Bytes(), []byte("--p2p=false")), "warning about a slow mapping in %q", out)
			m, ok := ctr.Mapping(64 << 30)
			require.True(t, ok)
			assert.GreaterOrEqual(t, m.Took, 2*time.Millisecond, "the MAP_DMA call's duration")

			buf.Reset()
			require.NoError(t, p.Unmap(64<<30))
			assert.Contains(t, buf.String(), `msg="DMA unmapping" kind=BAR name="00:06.0 BAR2" iova=0x1000000000 size=8192 took=`)
			assert.Empty(t, ctr.Mappings())
		})
	}
}

// plainDeviceFile is the least a vfio.DeviceFile must offer for
// vfio.NewPCIDevice to accept it: a PCI function with a 256-byte config
// space, no BARs, no interrupts. It records Close.
type plainDeviceFile struct {
	cfg    [256]byte
	closed int
}

func newPlainDeviceFile() *plainDeviceFile {
	f := &plainDeviceFile{}
	f.cfg[0], f.cfg[1], f.cfg[2], f.cfg[3] = 0x36, 0x1b, 0x10, 0x00 // 1b36:0010
	return f
}

func (f *plainDeviceFile) Info() (uapi.VFIODeviceInfo, error) {
	return uapi.VFIODeviceInfo{Flags: uapi.VFIODeviceFlagsPCI, NumRegions: uapi.VFIOPCINumRegions, NumIRQs: 5}, nil
}

func (f *plainDeviceFile) RegionInfo(i uint32) (uapi.VFIORegionInfo, error) {
	r := uapi.VFIORegionInfo{Index: i}
	if i == uapi.VFIOPCIConfigRegionIndex {
		r.Size, r.Flags = uint64(len(f.cfg)), uapi.VFIORegionInfoFlagRead|uapi.VFIORegionInfoFlagWrite
	}
	return r, nil
}

func (f *plainDeviceFile) IRQInfo(i uint32) (uapi.VFIOIRQInfo, error) {
	return uapi.VFIOIRQInfo{Index: i}, nil
}
func (f *plainDeviceFile) SetIRQEventFDs(_, _, _ uint32, _ []int32) error { return nil }
func (f *plainDeviceFile) SetIRQs(_, _, _, _ uint32) error                { return nil }
func (f *plainDeviceFile) DisableIRQs(uint32) error                       { return nil }
func (f *plainDeviceFile) Reset() error                                   { return nil }
func (f *plainDeviceFile) ReadAt(p []byte, off int64) (int, error) {
	return copy(p, f.cfg[min(int(off), len(f.cfg)):]), nil
}
func (f *plainDeviceFile) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
func (f *plainDeviceFile) Mmap(int64, int, int) ([]byte, error)   { return nil, unix.ENODEV }
func (f *plainDeviceFile) Munmap([]byte) error                    { return nil }
func (f *plainDeviceFile) Close() error                           { f.closed++; return nil }

// TestAddPassthroughFilesClosesEveryFileOnFailure fails the second stage
// of passthrough setup (putting the devices on the PCI bus) at the first of
// three devices: every device file must end up closed exactly once, by its
// PCIDevice or by the unwinding, since an open VFIO device fd keeps the
// device from going back to its host driver.
func TestAddPassthroughFilesClosesEveryFileOnFailure(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var mmio, pio bus.Bus
	root := pci.NewRoot(pci.RootConfig{MMIO: &mmio, PIO: &pio})
	// A device already in the first passthrough slot makes AddDevice fail.
	require.NoError(t, root.AddDevice(firstPassthroughSlot, "occupant", newPlainPCIDevice(t)))

	var files []*plainDeviceFile
	var dfs []vfio.DeviceFile
	pt := &passthrough{}
	for i := range 3 {
		f := newPlainDeviceFile()
		files, dfs = append(files, f), append(dfs, f)
		pt.specs = append(pt.specs, vfio.Spec{BDF: host.BDF{Bus: 1, Device: uint8(i)}, Clique: -1})
		pt.devs = append(pt.devs, &host.Device{BDF: host.BDF{Bus: 1, Device: uint8(i)}})
	}
	plan, err := flatPlan(pt.devs, []string{"a", "b", "c"})
	require.NoError(t, err)
	pt.topo = ptTopology{plan: plan, rootSlot: rootSlots(plan)}
	vm := &VM{log: log, dev: devices{pt: pt, pci: root}}
	err = vm.addPassthroughFiles(dfs, nil)
	require.ErrorContains(t, err, "slot taken")
	require.Len(t, pt.pcidevs, 1, "the first device was built before AddDevice refused it")
	require.NoError(t, vm.dev.closePassthrough(vm.log))
	for i, f := range files {
		assert.Equal(t, 1, f.closed, "device file %d closed once", i)
	}
}

// newPlainPCIDevice is a passthrough PCIDevice over a plainDeviceFile, to
// occupy a slot.
func newPlainPCIDevice(t *testing.T) *vfio.PCIDevice {
	pd, err := vfio.NewPCIDevice(newPlainDeviceFile(), vfio.Config{Name: "occupant"})
	require.NoError(t, err)
	t.Cleanup(func() { pd.Close() })
	return pd
}
