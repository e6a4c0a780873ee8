package ibvf

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The kernel's layout of the messages, from include/uapi/linux/if_link.h
// and rtnetlink.h: an RTM_SETLINK with an ifinfomsg, then
// IFLA_VFINFO_LIST { IFLA_VF_INFO { attr } } where attr is
// IFLA_VF_IB_NODE_GUID / IFLA_VF_IB_PORT_GUID carrying struct ifla_vf_guid
// {__u32 vf; __u64 guid;} (16 bytes: the u64 is 8-aligned) or
// IFLA_VF_LINK_STATE carrying struct ifla_vf_link_state {__u32 vf; __u32
// link_state;}. The numbers are ABI and never change.
const (
	kRTMSetlink         = 19
	kIFLAVFInfoList     = 22
	kIFLAVFInfo         = 1
	kIFLAVFLinkState    = 5
	kIFLAVFIBNodeGUID   = 10
	kIFLAVFIBPortGUID   = 11
	kSizeofNlmsghdr     = 16
	kSizeofIfinfomsg    = 16
	kSizeofIflaVfGUID   = 16
	kSizeofIflaVfLinkSt = 8
)

const helperEnv = "HPCVMM_IBVF_NETLINK_HELPER"

// TestNetlinkMessagesKernelLayout runs SetNodeGUID, SetPortGUID and
// SetLinkState against a veth in a fresh network namespace under strace,
// decodes the bytes the process actually sent, and checks them against
// the kernel's layout; the kernel must answer each with EOPNOTSUPP (veth
// has no VFs, so it parsed a well-formed request and found no
// ndo_set_vf_guid), not EINVAL or ERANGE (a malformed one). Needs root
// (CAP_NET_ADMIN, CAP_SYS_ADMIN for the namespace) and strace.
func TestNetlinkMessagesKernelLayout(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root for a network namespace and a veth pair")
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		testenv.SkipOrFail(t, "needs strace to capture the netlink messages sent (apt-get install strace)")
	}
	trace := filepath.Join(t.TempDir(), "strace.txt")
	cmd := exec.Command(strace, "-f", "-qq", "-e", "trace=sendto,sendmsg", "-e", "write=all", "-o", trace,
		os.Args[0], "-test.run=^TestNetlinkHelper$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "helper:\n%s", out)
	results := map[string]string{}
	for _, m := range regexp.MustCompile(`RESULT (\w+)=(\w+)`).FindAllStringSubmatch(string(out), -1) {
		results[m[1]] = m[2]
	}
	if results["veth"] != "ok" {
		testenv.SkipOrFail(t, "cannot make a veth pair in a new network namespace here: %s", out)
	}
	for _, k := range []string{"node", "port", "link"} {
		assert.Equal(t, "EOPNOTSUPP", results[k], "kernel's answer to the %s message (EINVAL or ERANGE would mean malformed)", k)
	}

	msgs := sentMessages(t, trace)
	var sets [][]byte
	for _, m := range msgs {
		if len(m) >= kSizeofNlmsghdr && binary.NativeEndian.Uint16(m[4:6]) == kRTMSetlink {
			sets = append(sets, m)
		}
	}
	require.Len(t, sets, 3, "one RTM_SETLINK per attribute")
	for i, want := range []struct {
		typ     uint16
		size    int
		payload func(p []byte)
	}{
		{kIFLAVFIBNodeGUID, kSizeofIflaVfGUID, func(p []byte) {
			assert.Equal(t, uint32(3), binary.NativeEndian.Uint32(p[0:4]), "vf")
			assert.Equal(t, uint64(0x0211223344556677), binary.NativeEndian.Uint64(p[8:16]), "guid at offset 8")
		}},
		{kIFLAVFIBPortGUID, kSizeofIflaVfGUID, func(p []byte) {
			assert.Equal(t, uint32(3), binary.NativeEndian.Uint32(p[0:4]))
			assert.Equal(t, uint64(0x02aabbccddeeff00), binary.NativeEndian.Uint64(p[8:16]))
		}},
		{kIFLAVFLinkState, kSizeofIflaVfLinkSt, func(p []byte) {
			assert.Equal(t, uint32(3), binary.NativeEndian.Uint32(p[0:4]))
			assert.Equal(t, uint32(LinkEnable), binary.NativeEndian.Uint32(p[4:8]), "IFLA_VF_LINK_STATE_ENABLE")
		}},
	} {
		m := sets[i]
		require.Equal(t, len(m), int(binary.NativeEndian.Uint32(m[0:4])), "nlmsg_len")
		flags := binary.NativeEndian.Uint16(m[6:8])
		assert.Equal(t, uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK), flags&(unix.NLM_F_REQUEST|unix.NLM_F_ACK))
		ifi := m[kSizeofNlmsghdr : kSizeofNlmsghdr+kSizeofIfinfomsg]
		assert.NotZero(t, int32(binary.NativeEndian.Uint32(ifi[4:8])), "ifi_index of the veth")
		list := m[kSizeofNlmsghdr+kSizeofIfinfomsg:]
		lt, lv := attr(t, list)
		require.Equal(t, uint16(kIFLAVFInfoList), lt&^unix.NLA_F_NESTED)
		it, iv := attr(t, lv)
		require.Equal(t, uint16(kIFLAVFInfo), it&^unix.NLA_F_NESTED)
		at, av := attr(t, iv)
		require.Equal(t, want.typ, at, "message %d", i)
		require.Len(t, av, want.size, "payload of attribute %d is the kernel struct", at)
		want.payload(av)
		// Exactly one attribute per nest: the kernel stops after the first GUID.
		require.Equal(t, 4+want.size, len(iv))
	}
}

// attr decodes the first rtattr of b: its type and payload.
func attr(t *testing.T, b []byte) (uint16, []byte) {
	t.Helper()
	require.GreaterOrEqual(t, len(b), 4)
	l := int(binary.NativeEndian.Uint16(b[0:2]))
	require.GreaterOrEqual(t, l, 4)
	require.LessOrEqual(t, l, len(b))
	return binary.NativeEndian.Uint16(b[2:4]), b[4:l]
}

// sentMessages reads strace's hex dumps (-e write=all): one byte slice per
// sendto/sendmsg.
func sentMessages(t *testing.T, path string) [][]byte {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var msgs [][]byte
	var cur []byte
	dump := regexp.MustCompile(`^ \| [0-9a-f]{5}  `)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if loc := dump.FindStringIndex(line); loc != nil {
			window := line[loc[1]:min(len(line), loc[1]+49)] // 16 bytes "xx " and a gap
			b, err := hex.DecodeString(strings.ReplaceAll(window, " ", ""))
			require.NoError(t, err, line)
			cur = append(cur, b...)
			continue
		}
		if strings.HasPrefix(line, " * ") {
			continue
		}
		if cur != nil {
			msgs = append(msgs, cur)
			cur = nil
		}
	}
	if cur != nil {
		msgs = append(msgs, cur)
	}
	require.NoError(t, sc.Err())
	return msgs
}

// TestNetlinkHelper is the process strace watches: in a new network
// namespace it makes a veth and sends the three messages. It does nothing
// unless started by TestNetlinkMessagesKernelLayout.
func TestNetlinkHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return // not a test on its own: the helper of TestNetlinkMessagesKernelLayout
	}
	runtime.LockOSThread() // the namespace belongs to this thread; never unlocked, so the thread dies with the test
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		fmt.Printf("RESULT veth=unshare_%v\n", err)
		return
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hv0"}, PeerName: "hv1"}
	if err := netlink.LinkAdd(veth); err != nil {
		fmt.Printf("RESULT veth=add_%v\n", err)
		return
	}
	fmt.Println("RESULT veth=ok")
	var s System
	report := func(name string, err error) {
		switch {
		case errors.Is(err, unix.EOPNOTSUPP):
			fmt.Printf("RESULT %s=EOPNOTSUPP\n", name)
		case err == nil:
			fmt.Printf("RESULT %s=accepted\n", name)
		default:
			fmt.Printf("RESULT %s=%s\n", name, strings.ReplaceAll(err.Error(), " ", "_"))
		}
	}
	report("node", s.SetNodeGUID("hv0", 3, 0x0211223344556677))
	report("port", s.SetPortGUID("hv0", 3, 0x02aabbccddeeff00))
	report("link", s.SetLinkState("hv0", 3, LinkEnable))
}
