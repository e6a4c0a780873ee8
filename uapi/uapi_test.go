package uapi

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeRun returns a Run over an ordinary 8-byte-aligned buffer of n bytes,
// standing in for the kvm_run mapping so the accessors can be tested (and
// fuzzed) without /dev/kvm.
func fakeRun(t testing.TB, n int) (*Run, []byte) {
	words := make([]uint64, (n+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n)
	r := newRun(mem)
	require.NotNil(t, r.hdr)
	return &r, mem
}

func TestCapAndExitStrings(t *testing.T) {
	assert.Equal(t, "KVM_CAP_IRQFD", CapIRQFD.String())
	assert.Equal(t, "KVM_CAP_BINARY_STATS_FD", CapBinaryStatsFD.String())
	assert.Equal(t, "KVM_CAP(9999)", Cap(9999).String())
	assert.Equal(t, "KVM_EXIT_IO", ExitIO.String())
	assert.Equal(t, "KVM_EXIT_SYSTEM_EVENT", ExitSystemEvent.String())
	assert.Equal(t, "KVM_EXIT(14)", ExitReason(14).String(), "gap in the table (s390 reason)")
	assert.Equal(t, "KVM_EXIT(4000000000)", ExitReason(4000000000).String())
}

func TestRunIOAccessor(t *testing.T) {
	r, mem := fakeRun(t, 4096)
	binary.LittleEndian.PutUint32(mem[8:], uint32(ExitIO))
	io := mem[kvmRunExitOffset:]
	io[0] = IOOut                                 // direction
	io[1] = 2                                     // size
	binary.LittleEndian.PutUint16(io[2:], 0x3f8)  // port
	binary.LittleEndian.PutUint32(io[4:], 3)      // count
	binary.LittleEndian.PutUint64(io[8:], 0x1000) // data_offset: past the end of a 4 KiB mapping
	assert.Equal(t, ExitIO, r.ExitReason())

	port, out, size, count, data := r.IO()
	assert.Equal(t, uint16(0x3f8), port)
	assert.True(t, out)
	assert.Equal(t, 2, size)
	assert.Equal(t, uint32(3), count)
	assert.Nil(t, data, "offset at the end of the mapping must not yield data")

	binary.LittleEndian.PutUint64(io[8:], 4096-6) // exactly fits 2*3 bytes
	copy(mem[4096-6:], "abcdef")
	_, _, _, _, data = r.IO()
	assert.Equal(t, []byte("abcdef"), data)
	assert.Equal(t, 6, cap(data), "data must not expose the rest of the mapping")

	binary.LittleEndian.PutUint64(io[8:], 4096-5) // one byte short
	_, _, _, _, data = r.IO()
	assert.Nil(t, data)

	binary.LittleEndian.PutUint64(io[8:], ^uint64(0)-2) // off+n would overflow
	_, _, _, _, data = r.IO()
	assert.Nil(t, data)

	io[0] = IOIn
	binary.LittleEndian.PutUint64(io[8:], 512)
	_, out, _, _, data = r.IO()
	assert.False(t, out)
	require.Len(t, data, 6)
	data[0] = 0x55 // an IN is answered by writing into the mapping
	assert.Equal(t, byte(0x55), mem[512])
}

func TestRunMMIOAndOtherAccessors(t *testing.T) {
	r, mem := fakeRun(t, 4096)
	u := mem[kvmRunExitOffset:]
	binary.LittleEndian.PutUint64(u[0:], 0xfee00300)
	copy(u[8:16], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	binary.LittleEndian.PutUint32(u[16:], 4)
	u[20] = 1
	addr, w, data := r.MMIO()
	assert.Equal(t, uint64(0xfee00300), addr)
	assert.True(t, w)
	assert.Equal(t, []byte{1, 2, 3, 4}, data)
	binary.LittleEndian.PutUint32(u[16:], 1000) // guest-controlled length is clamped
	_, _, data = r.MMIO()
	assert.Len(t, data, 8)

	// internal: suberror, ndata (clamped to 16), data.
	binary.LittleEndian.PutUint32(u[0:], InternalErrorEmulation)
	binary.LittleEndian.PutUint32(u[4:], 2)
	binary.LittleEndian.PutUint64(u[8:], 0xaa)
	binary.LittleEndian.PutUint64(u[16:], 0xbb)
	sub, words := r.InternalError()
	assert.Equal(t, uint32(InternalErrorEmulation), sub)
	assert.Equal(t, []uint64{0xaa, 0xbb}, words)
	binary.LittleEndian.PutUint32(u[4:], 99)
	_, words = r.InternalError()
	assert.Len(t, words, 16)

	// fail_entry: reason, cpu.
	binary.LittleEndian.PutUint64(u[0:], 0x80000021)
	binary.LittleEndian.PutUint32(u[8:], 7)
	reason, cpu := r.FailEntry()
	assert.Equal(t, uint64(0x80000021), reason)
	assert.Equal(t, uint32(7), cpu)
	assert.Equal(t, uint64(0x80000021), r.HardwareExitReason())

	// system_event: type, ndata, data.
	binary.LittleEndian.PutUint32(u[0:], SystemEventReset)
	binary.LittleEndian.PutUint32(u[4:], 1)
	binary.LittleEndian.PutUint64(u[8:], 42)
	typ, nd := r.SystemEvent()
	assert.Equal(t, uint32(SystemEventReset), typ)
	assert.Equal(t, uint32(1), nd)
	assert.Equal(t, uint64(42), r.SystemEventData(0))
	assert.Equal(t, uint64(0), r.SystemEventData(16))
	assert.Equal(t, uint64(0), r.SystemEventData(-1))

	binary.LittleEndian.PutUint32(u[0:], 14)
	binary.LittleEndian.PutUint32(u[4:], 0x1234)
	vec, code := r.Exception()
	assert.Equal(t, uint32(14), vec)
	assert.Equal(t, uint32(0x1234), code)
}

func TestRunFlags(t *testing.T) {
	r, mem := fakeRun(t, 4096)
	r.SetRequestInterruptWindow(true)
	r.SetImmediateExit(true)
	assert.Equal(t, byte(1), mem[0], "request_interrupt_window")
	assert.Equal(t, byte(1), mem[1], "immediate_exit")
	assert.True(t, r.ImmediateExit())
	r.SetImmediateExit(false)
	assert.Equal(t, byte(1), mem[0], "clearing immediate_exit must keep request_interrupt_window")
	assert.Equal(t, byte(0), mem[1])
	assert.False(t, r.ImmediateExit())
	r.SetRequestInterruptWindow(false)
	assert.Equal(t, byte(0), mem[0])

	mem[12], mem[13] = 1, 1
	assert.True(t, r.ReadyForInterruptInjection())
	assert.True(t, r.IFFlag())

	short := newRun(make([]byte, minRunMapping-1))
	assert.Nil(t, short.hdr, "a mapping smaller than kvm_run must be rejected")
}

func TestRunAccessorsDoNotAllocate(t *testing.T) {
	r, mem := fakeRun(t, 4096)
	binary.LittleEndian.PutUint64(mem[kvmRunExitOffset+8:], 64)
	mem[kvmRunExitOffset+1] = 1
	binary.LittleEndian.PutUint32(mem[kvmRunExitOffset+4:], 1)
	allocs := testing.AllocsPerRun(100, func() {
		_ = r.ExitReason()
		_, _, _, _, _ = r.IO()
		_, _, _ = r.MMIO()
		_, _ = r.FailEntry()
		_, _ = r.SystemEvent()
		r.SetImmediateExit(true)
		r.SetImmediateExit(false)
	})
	assert.Zero(t, allocs)
}

// FuzzRunAccessors feeds arbitrary (guest- or kernel-controlled) kvm_run
// contents to every accessor: none may panic or return data outside the
// mapping.
func FuzzRunAccessors(f *testing.F) {
	seed := make([]byte, 64)
	seed[kvmRunExitOffset+1] = 4
	seed[kvmRunExitOffset+4] = 1
	f.Add(seed, uint16(4096))
	f.Add([]byte{}, uint16(minRunMapping))
	f.Fuzz(func(t *testing.T, content []byte, size uint16) {
		n := max(int(size), minRunMapping)
		r, mem := fakeRun(t, n)
		copy(mem, content)
		memStart := uintptr(unsafe.Pointer(&mem[0]))
		memEnd := memStart + uintptr(len(mem))
		_, _, sz, count, data := r.IO()
		if data != nil {
			require.Equal(t, sz*int(count), len(data))
			if len(data) > 0 {
				p := uintptr(unsafe.Pointer(&data[0]))
				require.True(t, p >= memStart && p+uintptr(len(data)) <= memEnd)
			}
		}
		_, _, md := r.MMIO()
		require.LessOrEqual(t, len(md), 8)
		_, words := r.InternalError()
		require.LessOrEqual(t, len(words), 16)
		_, _ = r.FailEntry()
		_, _ = r.SystemEvent()
		_ = r.SystemEventData(int(size) - 100)
		_ = r.ExitReason().String()
	})
}

func TestMarshalGSIRouting(t *testing.T) {
	var chip, msi IRQRoutingEntry
	chip.GSI, chip.Type = 4, IRQRoutingIRQChip
	chip.IRQChip.Chip, chip.IRQChip.Pin = IRQChipIOAPIC, 4
	msi.GSI, msi.Type, msi.Flags = 24, IRQRoutingMSI, MSIValidDevID
	msi.MSI.AddressLo, msi.MSI.AddressHi, msi.MSI.Data, msi.MSI.DevID = 0xfee00000, 0x1, 0x4041, 0x0800

	p, err := marshalGSIRouting([]IRQRoutingEntry{chip, msi})
	require.NoError(t, err)
	b := unsafe.Slice((*byte)(p), 8+2*48)
	le := binary.LittleEndian
	assert.Equal(t, uint32(2), le.Uint32(b[0:]), "nr")
	e0, e1 := b[8:], b[8+48:]
	assert.Equal(t, []uint32{4, IRQRoutingIRQChip, 0, 0, IRQChipIOAPIC, 4},
		[]uint32{le.Uint32(e0), le.Uint32(e0[4:]), le.Uint32(e0[8:]), le.Uint32(e0[12:]), le.Uint32(e0[16:]), le.Uint32(e0[20:])})
	assert.Equal(t, []uint32{24, IRQRoutingMSI, MSIValidDevID, 0, 0xfee00000, 0x1, 0x4041, 0x0800},
		[]uint32{le.Uint32(e1), le.Uint32(e1[4:]), le.Uint32(e1[8:]), le.Uint32(e1[12:]),
			le.Uint32(e1[16:]), le.Uint32(e1[20:]), le.Uint32(e1[24:]), le.Uint32(e1[28:])})

	_, err = marshalGSIRouting([]IRQRoutingEntry{{GSI: 9, Type: 7}})
	assert.ErrorContains(t, err, "entry 0 (gsi 9) has type 7")
	_, err = marshalGSIRouting(make([]IRQRoutingEntry, maxIRQRoutes+1))
	assert.ErrorContains(t, err, "at most 4096")
}

func TestFlexBuf(t *testing.T) {
	hdr, ents, p := flexBuf[kvmMSRList, uint32](3)
	assert.Equal(t, unsafe.Pointer(hdr), p)
	require.Len(t, ents, 3)
	assert.Equal(t, uintptr(p)+4, uintptr(unsafe.Pointer(&ents[0])), "indices follow the 4-byte header")
	assert.Zero(t, uintptr(p)%8)
	hdr2, ents2, _ := flexBuf[kvmCPUID2, kvmCPUIDEntry2](0)
	assert.NotNil(t, hdr2)
	assert.Empty(t, ents2)
}

func TestOpenKVMPathErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kvm")
	_, err := OpenKVMPath(missing)
	require.Error(t, err)
	assert.ErrorIs(t, err, unix.ENOENT)
	assert.ErrorContains(t, err, missing+": ")
	assert.ErrorContains(t, err, "module loaded")

	if os.Geteuid() == 0 {
		return // root bypasses file permissions; the hint can't be provoked
	}
	noPerm := filepath.Join(t.TempDir(), "kvm")
	require.NoError(t, os.WriteFile(noPerm, nil, 0o000))
	_, err = OpenKVMPath(noPerm)
	assert.True(t, errors.Is(err, unix.EACCES), "%v", err)
	assert.ErrorContains(t, err, "kvm")
}

func TestMbind(t *testing.T) {
	_, err := os.Stat("/sys/devices/system/node/node0")
	if err != nil {
		t.Skipf("no NUMA node 0 in sysfs (%v): kernel without CONFIG_NUMA", err)
	}
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)

	require.NoError(t, Mbind(mem, MPolBind, []int{0}, MPolMFStrict|MPolMFMove))
	require.NoError(t, Mbind(mem, MPolPreferred, []int{0}, 0))
	require.NoError(t, Mbind(mem, MPolDefault, nil, 0))
	mem[0] = 1 // the range stays usable

	assert.ErrorContains(t, Mbind(nil, MPolBind, []int{0}, 0), "empty")
	assert.ErrorContains(t, Mbind(mem, MPolBind, []int{-1}, 0), "out of range")
	// Node 1000 is a valid id but not online here: the kernel refuses it.
	err = Mbind(mem, MPolBind, []int{1000}, 0)
	require.Error(t, err)
	assert.ErrorContains(t, err, "mbind: ")
	assert.ErrorIs(t, err, unix.EINVAL)
	// An unaligned start is refused by the kernel, not silently rounded.
	assert.ErrorIs(t, Mbind(mem[1:], MPolBind, []int{0}, 0), unix.EINVAL)
}
