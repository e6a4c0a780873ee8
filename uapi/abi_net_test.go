package uapi

import (
	"testing"
	"unsafe"
)

// netABIItems lists every linux/if_tun.h and linux/vhost.h fact tun.go and
// vhost.go mirror.
func netABIItems() []abiItem {
	const (
		ifr   = "struct ifreq"
		state = "struct vhost_vring_state"
		file  = "struct vhost_vring_file"
		addr  = "struct vhost_vring_addr"
		mem   = "struct vhost_memory"
		reg   = "struct vhost_memory_region"
	)
	var (
		r  ifreq
		s  vhostVringState
		f  vhostVringFile
		a  vhostVringAddr
		m  vhostMemory
		mr vhostMemoryRegion
	)
	return []abiItem{
		size(ifr, unsafe.Sizeof(r)),
		off(ifr, "ifr_name", unsafe.Offsetof(r.Name)),
		off(ifr, "ifr_flags", unsafe.Offsetof(r.Flags)),
		val("IFNAMSIZ", uint64(len(r.Name))),

		val("TUNSETIFF", uint64(tunSetIFF)),
		val("TUNSETPERSIST", uint64(tunSetPersist)),
		val("TUNSETOWNER", uint64(tunSetOwner)),
		val("TUNSETGROUP", uint64(tunSetGroup)),
		val("IFF_PERSIST", IFFPersist),
		val("TUNSETOFFLOAD", uint64(tunSetOffload)),
		val("TUNGETIFF", uint64(tunGetIFF)),
		val("TUNSETVNETHDRSZ", uint64(tunSetVnetHdrSz)),
		val("TUNSETQUEUE", uint64(tunSetQueue)),
		val("IFF_TAP", IFFTap),
		val("IFF_NO_PI", IFFNoPI),
		val("IFF_VNET_HDR", IFFVnetHdr),
		val("IFF_MULTI_QUEUE", IFFMultiQueue),
		val("IFF_ATTACH_QUEUE", IFFAttachQueue),
		val("IFF_DETACH_QUEUE", IFFDetachQueue),
		val("TUN_F_CSUM", TunFCsum),
		val("TUN_F_TSO4", TunFTSO4),
		val("TUN_F_TSO6", TunFTSO6),
		val("TUN_F_TSO_ECN", TunFTSOECN),
		val("TUN_F_UFO", TunFUFO),

		size(state, unsafe.Sizeof(s)),
		off(state, "index", unsafe.Offsetof(s.Index)), off(state, "num", unsafe.Offsetof(s.Num)),
		size(file, unsafe.Sizeof(f)),
		off(file, "index", unsafe.Offsetof(f.Index)), off(file, "fd", unsafe.Offsetof(f.FD)),
		size(addr, unsafe.Sizeof(a)),
		off(addr, "index", unsafe.Offsetof(a.Index)), off(addr, "flags", unsafe.Offsetof(a.Flags)),
		off(addr, "desc_user_addr", unsafe.Offsetof(a.DescUserAddr)),
		off(addr, "used_user_addr", unsafe.Offsetof(a.UsedUserAddr)),
		off(addr, "avail_user_addr", unsafe.Offsetof(a.AvailUserAddr)),
		off(addr, "log_guest_addr", unsafe.Offsetof(a.LogGuestAddr)),
		size(mem, unsafe.Sizeof(m)),
		off(mem, "nregions", unsafe.Offsetof(m.NRegions)), off(mem, "padding", unsafe.Offsetof(m.Padding)),
		off(mem, "regions", unsafe.Sizeof(m)),
		size(reg, unsafe.Sizeof(mr)),
		off(reg, "guest_phys_addr", unsafe.Offsetof(mr.GuestPhysAddr)),
		off(reg, "memory_size", unsafe.Offsetof(mr.MemorySize)),
		off(reg, "userspace_addr", unsafe.Offsetof(mr.UserspaceAddr)),
		off(reg, "flags_padding", unsafe.Offsetof(mr.FlagsPadding)),

		val("VHOST_GET_FEATURES", uint64(vhostGetFeatures)),
		val("VHOST_SET_FEATURES", uint64(vhostSetFeatures)),
		val("VHOST_SET_OWNER", uint64(vhostSetOwner)),
		val("VHOST_SET_MEM_TABLE", uint64(vhostSetMemTable)),
		val("VHOST_SET_VRING_NUM", uint64(vhostSetVringNum)),
		val("VHOST_SET_VRING_ADDR", uint64(vhostSetVringAddr)),
		val("VHOST_SET_VRING_BASE", uint64(vhostSetVringBase)),
		val("VHOST_SET_VRING_KICK", uint64(vhostSetVringKick)),
		val("VHOST_SET_VRING_CALL", uint64(vhostSetVringCall)),
		val("VHOST_NET_SET_BACKEND", uint64(vhostNetSetBackend)),
		val("VHOST_PAGE_SIZE", vhostPageSize),
		val("VHOST_FILE_UNBIND + 1", uint64(vhostFileUnbind+1)),
		val("1ULL << VHOST_NET_F_VIRTIO_NET_HDR", VhostNetFVirtioNetHdr),
		val("1ULL << VHOST_F_LOG_ALL", VhostFLogAll),
	}
}

// TestNetABIConformance checks the TUN and vhost mirrors against
// /usr/include/linux/{if_tun,if,vhost}.h, the way TestABIConformance checks
// the KVM ones (its helpers, its own C program).
func TestNetABIConformance(t *testing.T) {
	n := checkABI(t, []string{"linux/if.h", "linux/if_tun.h", "linux/vhost.h"}, netABIItems())
	t.Logf("checked %d TUN/vhost sizes, offsets, ioctl numbers and constants against the kernel headers", n)
}
