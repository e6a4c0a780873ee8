package seccomp

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	libseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData encodes struct seccomp_data for x/net/bpf's VM, which loads
// words big-endian from a packet: each 32-bit field is stored big-endian
// at the offset the kernel's filter reads it from (the kernel itself loads
// them in host order from the struct).
func seccompData(nr, auditArch uint32, args [6]uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], auditArch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	return b
}

// reference decides a call the way the rules say, in Go.
func reference(names []string, rules []argRule, nr uint32, args [6]uint64, a *arch.Info) bool {
	for _, r := range rules {
		if uint32(a.SyscallNames[r.name]) != nr {
			continue
		}
		v := args[r.arg]
		if r.equal {
			return slices.Contains(r.values, v)
		}
		return uint32(v)&uint32(r.values[0]) == 0
	}
	for _, n := range names {
		if uint32(a.SyscallNames[n]) == nr {
			return true
		}
	}
	return false
}

// TestProgramMatchesRules runs both filters in a BPF interpreter on random
// calls and compares every answer with the rules evaluated in Go. The calls
// are drawn to hit the edges: the listed syscalls and their neighbours,
// arguments equal to listed values or to other syscalls' numbers (the
// accumulator mix-up go-seccomp-bpf's conditions have), write flags alone
// and combined, high halves set.
func TestProgramMatchesRules(t *testing.T) {
	a, err := arch.GetInfo("")
	require.NoError(t, err)
	const pid = 4242
	sockets := []int{7, 1000}
	rules, err := argRules(pid, sockets)
	require.NoError(t, err)
	for _, k := range []Kind{Process, VCPU} {
		var kr []argRule
		if k == Process {
			kr = rules
		}
		raw, err := program(k, Kill, pid, sockets)
		require.NoError(t, err)
		vm, err := bpf.NewVM(disassemble(t, raw))
		require.NoError(t, err)
		var nrs []uint32
		for _, n := range lists[k] {
			nr := uint32(a.SyscallNames[n])
			nrs = append(nrs, nr, nr+1, nr-1)
		}
		var interesting []uint64
		for _, r := range rules {
			interesting = append(interesting, r.values...)
		}
		interesting = append(interesting, 0, 1, 2, 3, 4, 7, 9, 10, 0x40, 0x200, 0x400, unix.O_CLOEXEC, unix.TIOCSTI, pid+1, 1<<32|pid, 1<<32|uint64(unix.PR_SET_NAME))
		for _, n := range lists[Process] {
			interesting = append(interesting, uint64(a.SyscallNames[n]))
		}
		r := rand.New(rand.NewPCG(1, 2))
		arg := func() uint64 {
			switch r.IntN(3) {
			case 0:
				return interesting[r.IntN(len(interesting))]
			case 1:
				x, y := r.IntN(len(interesting)), r.IntN(len(interesting))
				return interesting[x] | interesting[y]
			}
			return r.Uint64()
		}
		allowed := 0
		for i := 0; i < 200000; i++ {
			nr := nrs[r.IntN(len(nrs))]
			var args [6]uint64
			for j := range args {
				args[j] = arg()
			}
			got, err := vm.Run(seccompData(nr, uint32(a.ID), args))
			require.NoError(t, err)
			want := reference(lists[k], kr, nr, args, a)
			require.Equal(t, want, uint32(got) == uint32(libseccomp.ActionAllow),
				"%s filter: syscall %d (%s) args %#x: program says %#x", k, nr, Name(int(nr)), args, got)
			if want {
				allowed++
			}
		}
		// Another architecture's calls and x32's never pass.
		got, err := vm.Run(seccompData(uint32(a.SyscallNames["read"]), uint32(arch.I386.ID), [6]uint64{}))
		require.NoError(t, err)
		require.Equal(t, uint32(libseccomp.ActionKillProcess), uint32(got))
		got, err = vm.Run(seccompData(uint32(a.SyscallNames["read"])|uint32(arch.X32.SeccompMask), uint32(a.ID), [6]uint64{}))
		require.NoError(t, err)
		require.Equal(t, uint32(libseccomp.ActionErrno)|uint32(unix.ENOSYS), uint32(got))
		t.Logf("%s filter: %d instructions, 200000 calls, %d allowed, all as the rules say", k, len(raw), allowed)
	}
}

func disassemble(t *testing.T, raw []bpf.RawInstruction) []bpf.Instruction {
	insts, ok := bpf.Disassemble(raw)
	require.True(t, ok, "the program has an instruction x/net/bpf cannot decode")
	return insts
}

// TestRulesDescribeTheProgram: Rules (the words) names exactly the
// syscalls argRules (the program) conditions, and a violation's message
// says which form of such a syscall passes.
func TestRulesDescribeTheProgram(t *testing.T) {
	rules, err := argRules(1, []int{5})
	require.NoError(t, err)
	var inProgram, described []string
	for _, r := range rules {
		inProgram = append(inProgram, r.name)
	}
	for _, r := range Rules() {
		described = append(described, r.Name)
	}
	require.ElementsMatch(t, inProgram, described)
	v := Violation{PID: 7, Comm: "vcpu0", Syscall: 257, Name: "openat"}
	require.Contains(t, v.String(), "the process filter allows openat without O_WRONLY")
	v = Violation{PID: 7, Comm: "vcpu0", Syscall: 63, Name: "uname", Killed: true}
	require.NotContains(t, v.String(), "allows")
}
