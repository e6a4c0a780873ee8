package vmm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// recordingSlots records the memslots it is given, as KVM would take them.
type recordingSlots struct {
	regions []uapi.UserspaceMemoryRegion
	fail    error
}

func (r *recordingSlots) SetUserMemoryRegion(reg uapi.UserspaceMemoryRegion) error {
	if r.fail != nil {
		return r.fail
	}
	r.regions = append(r.regions, reg)
	return nil
}

// imageFile writes a file of n bytes of a pattern (a header of pad bytes
// first) and returns its path and contents.
func imageFile(t *testing.T, pad, n int) (string, []byte) {
	t.Helper()
	data := make([]byte, pad+n)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	p := filepath.Join(t.TempDir(), "image.sqfs")
	require.NoError(t, os.WriteFile(p, data, 0o644))
	return p, data
}

func TestPMEMConfigValidate(t *testing.T) {
	assert.Empty(t, PMEMConfig{}.validate())
	assert.Empty(t, PMEMConfig{Path: "/i", Offset: 8192, Size: 1}.validate())
	for _, tc := range []struct {
		cfg  PMEMConfig
		want string
	}{
		{PMEMConfig{Path: "/i", Offset: 100, Size: 10}, "not a multiple of 4096"},
		{PMEMConfig{Path: "/i", Offset: -4096, Size: 10}, "not a multiple of 4096"},
		{PMEMConfig{Path: "/i", Size: 0}, "size 0"},
		{PMEMConfig{Path: "/i", Size: addrspace.MaxPMEM + 1}, "outside"},
		{PMEMConfig{Size: 10}, "without a path"},
	} {
		errs := tc.cfg.validate()
		require.Len(t, errs, 1, "%+v", tc.cfg)
		var fe *FieldError
		require.True(t, errors.As(errs[0], &fe))
		assert.Equal(t, "PMEM", fe.Field)
		assert.Contains(t, errs[0].Error(), tc.want)
	}
}

func TestOpenPMEMRefusals(t *testing.T) {
	p, _ := imageFile(t, 0, 10000)
	_, err := openPMEM(os.Open, PMEMConfig{Path: p, Offset: 4096, Size: 10000})
	assert.ErrorContains(t, err, "lie past its end (10000 bytes): the file is truncated")
	_, err = openPMEM(os.Open, PMEMConfig{Path: t.TempDir(), Size: 1})
	assert.ErrorContains(t, err, "is not a regular file")
	_, err = openPMEM(os.Open, PMEMConfig{Path: "/nonexistent/image", Size: 1})
	assert.Error(t, err)
	im, err := openPMEM(os.Open, PMEMConfig{Path: p, Offset: 4096, Size: 10000 - 4096})
	require.NoError(t, err)
	require.NoError(t, im.close())
}

// TestPMEMSlots maps an image the size of no whole page at an offset in
// its file, as a SIF's partition: the file's pages go in one read-only
// slot at the range's base, the zero padding to the 2 MiB-aligned end in
// a second, the slots hold exactly the file's bytes, and nothing is
// writable.
func TestPMEMSlots(t *testing.T) {
	const off, size = 8192, 3<<20 + 100
	path, data := imageFile(t, off, size)
	im, err := openPMEM(os.Open, PMEMConfig{Path: path, Offset: off, Size: size})
	require.NoError(t, err)
	defer im.close()
	r := addrspace.PMEM(1<<30, size)
	require.Equal(t, addrspace.Range{GPA: 4 << 30, Size: 4 << 20}, r)
	require.NoError(t, im.mapFile(r.Size))
	rec := &recordingSlots{}
	slots := &memslots{vm: rec, next: 2}
	require.NoError(t, im.install(slots, r.GPA))

	fileLen := uint64(3<<20 + 4096) // size rounded up to a page
	require.Len(t, rec.regions, 2)
	s0, s1 := rec.regions[0], rec.regions[1]
	assert.Equal(t, uint32(2), s0.Slot)
	assert.Equal(t, uint32(uapi.MemReadonly), s0.Flags)
	assert.Equal(t, r.GPA, s0.GuestPhysAddr)
	assert.Equal(t, fileLen, uint64(len(s0.Memory)))
	assert.True(t, bytes.Equal(data[off:], s0.Memory[:size]), "the slot maps the file's bytes from the offset")
	assert.Equal(t, uint32(3), s1.Slot)
	assert.Equal(t, uint32(uapi.MemReadonly), s1.Flags)
	assert.Equal(t, r.GPA+fileLen, s1.GuestPhysAddr)
	assert.Equal(t, r.End(), s1.GuestPhysAddr+uint64(len(s1.Memory)), "the slots cover the whole e820 range")
	assert.Zero(t, bytes.Count(s1.Memory, []byte{0})-len(s1.Memory), "padding reads as zeros")

	// The file is opened read-only: the mapping cannot be made writable.
	_, err = syscall.Mmap(int(im.file.Fd()), off, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	assert.Error(t, err, "a shared writable mapping of an O_RDONLY file")
}

// TestOpenPMEMTakesTheCallersFile: with File set, the image is a
// duplicate of the caller's descriptor (the file the caller checked), not
// Path opened again: a file renamed over Path in between is not mapped.
func TestOpenPMEMTakesTheCallersFile(t *testing.T) {
	path, data := imageFile(t, 0, 8192)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	other := filepath.Join(t.TempDir(), "other")
	require.NoError(t, os.WriteFile(other, make([]byte, 8192), 0o644))
	require.NoError(t, os.Rename(other, path))
	opened := false
	im, err := openPMEM(func(string) (*os.File, error) { opened = true; return nil, errors.New("not called") }, PMEMConfig{Path: path, File: f, Size: 8192})
	require.NoError(t, err)
	defer im.close()
	assert.False(t, opened)
	assert.Nil(t, im.cfg.File)
	require.NoError(t, im.mapFile(2<<20))
	assert.True(t, bytes.Equal(data, im.data[:8192]), "the caller's file, not what Path names now")
	require.NoError(t, f.Close())
	assert.Empty(t, im.changed(), "the duplicate outlives the caller's descriptor")
}

func TestPMEMExactSizeHasNoPadding(t *testing.T) {
	path, _ := imageFile(t, 0, 2<<20)
	im, err := openPMEM(os.Open, PMEMConfig{Path: path, Size: 2 << 20})
	require.NoError(t, err)
	defer im.close()
	require.NoError(t, im.mapFile(2<<20))
	rec := &recordingSlots{}
	require.NoError(t, im.install(&memslots{vm: rec}, 4<<30))
	require.Len(t, rec.regions, 1)
}

func TestPMEMSlotFailureFreesTheSlot(t *testing.T) {
	path, _ := imageFile(t, 0, 4096)
	im, err := openPMEM(os.Open, PMEMConfig{Path: path, Size: 4096})
	require.NoError(t, err)
	defer im.close()
	require.NoError(t, im.mapFile(2<<20))
	rec := &recordingSlots{fail: errors.New("EINVAL")}
	slots := &memslots{vm: rec, next: 5}
	assert.ErrorContains(t, im.install(slots, 4<<30), "EINVAL")
	assert.Equal(t, []uint32{5}, slots.free, "the slot number goes back")
}

// TestPMEMChangedBeforeMapping: a file changed between the checks and the
// mapping is refused, not mapped.
func TestPMEMChangedBeforeMapping(t *testing.T) {
	path, _ := imageFile(t, 0, 8192)
	im, err := openPMEM(os.Open, PMEMConfig{Path: path, Size: 8192})
	require.NoError(t, err)
	defer im.close()
	require.NoError(t, os.Truncate(path, 4096))
	err = im.mapFile(2 << 20)
	assert.ErrorContains(t, err, "changed size from 8192 to 4096 bytes since hpcvmm opened it")
	assert.Nil(t, im.data)
}

// TestGuestMemoryFaultNamesTheTruncatedImage: the EFAULT a vCPU stops on
// after the image lost pages becomes an error that says so.
func TestGuestMemoryFaultNamesTheTruncatedImage(t *testing.T) {
	path, _ := imageFile(t, 0, 8192)
	im, err := openPMEM(os.Open, PMEMConfig{Path: path, Size: 8192})
	require.NoError(t, err)
	vm := &VM{dev: devices{pmem: im}}
	defer im.close()
	// As uapi.VCPU.Run and the vCPU loop wrap it.
	reason := fmt.Errorf("vCPU 0: %w", fmt.Errorf("kvm: KVM_RUN (vcpu 0): %w", syscall.EFAULT))
	require.True(t, isGuestMemoryFault(reason))
	assert.ErrorContains(t, vm.guestMemoryFault(reason), "KVM could not reach guest memory")
	require.NoError(t, os.Truncate(path, 0))
	err = vm.guestMemoryFault(reason)
	assert.ErrorContains(t, err, "the image "+path+" changed size from 8192 to 0 bytes while the VM ran")
	assert.NotContains(t, err.Error(), "\n")
	assert.False(t, isGuestMemoryFault(errors.New("vCPU 0: triple fault")))
}

// TestPMEMGuardRefusesWrites: a guest write to the image (what a
// read-only memslot sends out of KVM as an MMIO exit) is ignored, logged
// once per interval with the count of the rest, and allocates nothing.
func TestPMEMGuardRefusesWrites(t *testing.T) {
	var log bytes.Buffer
	ref := platform.NewRefusals(slog.New(slog.NewTextHandler(&log, nil)), time.Hour)
	var b bus.Bus
	const base = 4 << 30
	require.NoError(t, b.Register(base, 4<<20, "pmem image", pmemGuard{refusals: ref}))
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	for range 100 {
		require.True(t, b.Write(base+4096, data), "the bus routes the write to the guard")
	}
	assert.Equal(t, uint64(100), ref.Count(pmemRefusalKind))
	assert.Equal(t, 1, strings.Count(log.String(), "guest wrote to the read-only image"), "rate-limited: %s", log.String())
	allocs := testing.AllocsPerRun(1000, func() { b.Write(base+8, data) })
	assert.Zero(t, allocs, "the exit path allocates nothing")

	read := []byte{9, 9, 9, 9}
	require.True(t, b.Read(base, read))
	assert.Equal(t, []byte{0, 0, 0, 0}, read, "an exiting read gets zeros, never the mapping")
}

// BenchmarkPMEMGuardWrite is one refused guest write to the image as the
// vCPU's exit path serves it: the bus lookup and the rate-limited refusal.
func BenchmarkPMEMGuardWrite(b *testing.B) {
	ref := platform.NewRefusals(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour)
	var bs bus.Bus
	if err := bs.Register(4<<30, 4<<20, "pmem image", pmemGuard{refusals: ref}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 8)
	b.ReportAllocs()
	for b.Loop() {
		bs.Write(4<<30+64, data)
	}
}
