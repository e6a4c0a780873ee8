// Package ibvf gives InfiniBand SR-IOV virtual functions their identity:
// the node GUID and port GUID the subnet manager sees, and the VF's link
// state. A VF of an InfiniBand HCA starts with zero GUIDs, and a zero port
// GUID keeps its link down in the guest; libvirt does not set them for
// InfiniBand, so hpcvmm does, as ib-sriov-cni and KubeVirt do.
//
// The kernel sets them through the PF's IPoIB netdev with RTM_SETLINK
// messages carrying IFLA_VFINFO_LIST → IFLA_VF_INFO → IFLA_VF_IB_NODE_GUID,
// IFLA_VF_IB_PORT_GUID or IFLA_VF_LINK_STATE. Each attribute goes in a
// message of its own, because the kernel's do_setvfinfo returns after the
// first GUID in a nest. The messages are built with
// github.com/vishvananda/netlink's nl package as its LinkSetVfNodeGUID,
// LinkSetVfPortGUID and LinkSetVfState build them, and sent on a Conn: one
// rtnetlink socket, opened once, so that a VM can open it before its
// seccomp filter (which has no socket(2)) and restore the identities
// through it at teardown. The current values are read back with
// RTM_GETLINK (RTEXT_FILTER_VF), whose IFLA_VF_IB_*_GUID attributes
// v1.3.1's VfInfo does not carry, so this package decodes them itself.
//
// Package hoststate journals every change made here with the values read
// before it, so they are restored when the VM ends and by `hpcvmm unbind`
// after a crash.
//
// # Derived GUIDs (guid=auto)
//
// Derive makes a VF's GUIDs from a Seed that is unique in the cluster at
// any time: the Slurm cluster name, the job ID, the node name, and the VF's
// PCI address (which fixes its PF and its VF index on this node). Each GUID
// is the first 8 bytes of SHA-256("hpcvmm-ib-guid-v1" NUL cluster NUL job
// NUL node NUL vf-address NUL role), role "node" or "port", read big-endian
// as an EUI-64 with the universal/local bit set (locally administered:
// never equal to a vendor-assigned GUID) and the group bit clear. The same
// job, node and VF always get the same GUIDs (a restarted step, the
// Prolog and the step agree); different ones collide only as two random
// 62-bit numbers do (about 1 in 10^7 for a million VFs at once).
package ibvf
