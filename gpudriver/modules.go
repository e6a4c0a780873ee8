package gpudriver

import (
	"strconv"
	"strings"
)

// Modules are kernel module names for the guest, in the terms of
// package kmodules' Config: Load into Modules, Optional and Exclude into
// its fields of those names.
type Modules struct {
	// Load must be loaded (or built in), with their dependencies.
	Load []string
	// Optional are loaded where the guest kernel has them.
	Optional []string
	// Exclude are never loaded, whatever device's modalias they match.
	Exclude []string
	// RequireFirmware are patterns (fnmatch, kmodules.Match) of firmware
	// names the guest must get when a loaded module names them
	// (kmodules.Config's and initramfs.Config's RequireFirmware).
	RequireFirmware []string
}

// GSPFirmware matches the GSP firmware the NVIDIA kernel module names
// (its nv.c's MODULE_FIRMWARE, nvidia/VERSION/gsp_ga10x.bin and
// gsp_tu10x.bin): the open module runs the GPU through its GSP, which it
// boots from that file when it first brings the GPU up; without it the
// driver cannot use a Turing or later GPU (Hopper: gsp_ga10x.bin).
const GSPFirmware = "nvidia/*/gsp_*.bin"

// The modules of an NVIDIA GPU: the driver and the unified memory module
// CUDA needs, which no modalias names (nvidia-modprobe loads it on a
// host); nvidia_modeset where the driver has it (display, DRM); and
// nvidia_peermem, GPUDirect RDMA, when an RDMA device is passed too.
// Never nouveau, whose modalias matches the same GPUs: it would bind
// first, or fight nvidia for them.
var (
	gpuLoad     = []string{"nvidia", "nvidia_uvm"}
	gpuOptional = []string{"nvidia_modeset"}
	gpuPeerMem  = "nvidia_peermem"
	gpuExclude  = []string{"nouveau"}
)

// rdmaLoad are the modules rdma-core's udev rules load for a Mellanox or
// NVIDIA ConnectX function on a host (rdma-core's kernel-boot rules and
// rdma-load-modules@rdma.service's rdma.conf): the mlx5 InfiniBand driver,
// so the function registers an RDMA device, and the user-space verbs,
// management datagram and connection manager interfaces
// (/dev/infiniband/uverbsN, umadN, rdma_cm), which MPI's transports use.
var rdmaLoad = []string{"mlx5_ib", "ib_uverbs", "ib_umad", "rdma_ucm"}

// PCI vendors and classes of the devices with modules of their own.
const (
	vendorNVIDIA   = 0x10de
	vendorMellanox = 0x15b3
	classDisplay   = 0x03 // 0300 VGA, 0302 3D controller (data-centre GPUs)
	classNetwork   = 0x02 // 0200 Ethernet, 0207 InfiniBand
)

// ForModaliases returns the modules for the passed-through devices whose
// modaliases (kmodules.PCIModalias) are given: an NVIDIA display or 3D
// controller brings the GPU's modules (and requires its GSP firmware), a Mellanox/NVIDIA ConnectX network
// function (physical or virtual; vendor 15b3, as the NVIDIA-branded
// ConnectX parts still are) the RDMA stack's, and both together
// nvidia_peermem. Other devices bring nothing: their drivers load by
// modalias. A modalias that does not parse brings nothing either.
func ForModaliases(aliases []string) Modules {
	var gpu, rdma bool
	for _, a := range aliases {
		v, class, ok := parsePCIModalias(a)
		gpu = gpu || ok && v == vendorNVIDIA && class == classDisplay
		rdma = rdma || ok && v == vendorMellanox && class == classNetwork
	}
	var m Modules
	if gpu {
		m.Load = append(m.Load, gpuLoad...)
		m.Optional = append(m.Optional, gpuOptional...)
		m.Exclude = append(m.Exclude, gpuExclude...)
		m.RequireFirmware = append(m.RequireFirmware, GSPFirmware)
		if rdma {
			m.Optional = append(m.Optional, gpuPeerMem)
		}
	}
	if rdma {
		m.Load = append(m.Load, rdmaLoad...)
	}
	return m
}

// GPUs counts the NVIDIA GPUs (display or 3D controllers of vendor
// 0x10de) among the passed-through devices' modaliases: the GPUs whose
// device nodes a guest needs (Nodes).
func GPUs(aliases []string) int {
	n := 0
	for _, a := range aliases {
		if v, class, ok := parsePCIModalias(a); ok && v == vendorNVIDIA && class == classDisplay {
			n++
		}
	}
	return n
}

// parsePCIModalias reads the vendor and base class of a PCI modalias,
// "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00".
func parsePCIModalias(a string) (vendor, class uint32, ok bool) {
	rest, ok := strings.CutPrefix(a, "pci:v")
	if !ok || len(rest) < 8 {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(rest[:8], 16, 32)
	if err != nil {
		return 0, 0, false
	}
	i := strings.Index(rest, "bc")
	if i < 0 || len(rest) < i+4 {
		return 0, 0, false
	}
	c, err := strconv.ParseUint(rest[i+2:i+4], 16, 8)
	if err != nil {
		return 0, 0, false
	}
	return uint32(v), uint32(c), true
}
