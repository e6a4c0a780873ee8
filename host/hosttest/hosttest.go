// Package hosttest builds synthetic sysfs/procfs trees in a test's temporary
// directory, laid out exactly as a live kernel lays them out (real symlinks
// for driver, iommu_group, physfn and virtfnN), so host and preflight tests
// can cover multi-node, SR-IOV and IOMMU-group cases no single machine has.
package hosttest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcvmm/hpcvmm/host"
)

// Tree is a synthetic host rooted at Root, with Root/sys, Root/proc and
// Root/dev.
type Tree struct {
	t     testing.TB
	Root  string
	nodes []int
}

// New returns an empty tree in t.TempDir(): no nodes, no devices, no IOMMU
// groups, no /dev/kvm.
func New(t testing.TB) *Tree {
	t.Helper()
	tr := &Tree{t: t, Root: t.TempDir()}
	for _, d := range []string{"sys/bus/pci/devices", "sys/bus/pci/drivers", "proc", "dev"} {
		tr.mkdir(d)
	}
	return tr
}

// Sys is the sysfs root to pass to host.New (or hpcvmm's --sysfs).
func (tr *Tree) Sys() string { return filepath.Join(tr.Root, "sys") }

// Proc is the procfs root to pass to host.New (or hpcvmm's --procfs).
func (tr *Tree) Proc() string { return filepath.Join(tr.Root, "proc") }

// Host returns host.New over the tree.
func (tr *Tree) Host() *host.Host { return host.New(tr.Sys(), tr.Proc()) }

func (tr *Tree) mkdir(rel string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.Root, rel), 0o755); err != nil {
		tr.t.Fatalf("hosttest: mkdir %s: %v", rel, err)
	}
}

// Write creates the file rel (relative to Root) with content, making parents.
func (tr *Tree) Write(rel, content string) {
	tr.t.Helper()
	tr.mkdir(filepath.Dir(rel))
	if err := os.WriteFile(filepath.Join(tr.Root, rel), []byte(content), 0o644); err != nil {
		tr.t.Fatalf("hosttest: write %s: %v", rel, err)
	}
}

// Symlink creates the symlink rel -> target, making parents.
func (tr *Tree) Symlink(rel, target string) {
	tr.t.Helper()
	tr.mkdir(filepath.Dir(rel))
	p := filepath.Join(tr.Root, rel)
	_ = os.Remove(p)
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatalf("hosttest: symlink %s: %v", rel, err)
	}
}

// Remove deletes rel and everything below it.
func (tr *Tree) Remove(rel string) {
	tr.t.Helper()
	if err := os.RemoveAll(filepath.Join(tr.Root, rel)); err != nil {
		tr.t.Fatalf("hosttest: remove %s: %v", rel, err)
	}
}

// Pool is a hugepage pool to create: page size in bytes, total, free.
type Pool struct {
	Size, Total, Free uint64
}

// Node adds NUMA node id with the given CPU list and hugepage pools and
// rewrites the node "online" list.
func (tr *Tree) Node(id int, cpus string, memFree uint64, pools ...Pool) {
	tr.t.Helper()
	dir := fmt.Sprintf("sys/devices/system/node/node%d", id)
	tr.Write(dir+"/cpulist", cpus+"\n")
	tr.Write(dir+"/meminfo", fmt.Sprintf("Node %d MemTotal:  %d kB\nNode %d MemFree:   %d kB\nNode %d HugePages_Total:     0\n",
		id, 2*memFree>>10, id, memFree>>10, id))
	tr.mkdir(dir + "/hugepages")
	for _, p := range pools {
		pd := dir + "/hugepages/" + host.HugepageDirName(p.Size)
		tr.Write(pd+"/nr_hugepages", fmt.Sprintf("%d\n", p.Total))
		tr.Write(pd+"/free_hugepages", fmt.Sprintf("%d\n", p.Free))
	}
	tr.nodes = append(tr.nodes, id)
	tr.Write("sys/devices/system/node/online", host.FormatCPUList(tr.nodes)+"\n")
}

// CPUInfo writes /proc/cpuinfo with the given physical address width.
func (tr *Tree) CPUInfo(physBits int) {
	tr.Write("proc/cpuinfo", fmt.Sprintf("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: Synthetic\naddress sizes\t: %d bits physical, 48 bits virtual\n\n", physBits))
}

// Interrupts writes /proc/interrupts with remapped ("IR-") chips or not.
func (tr *Tree) Interrupts(remapped bool) {
	p := ""
	if remapped {
		p = "IR-"
	}
	tr.Write("proc/interrupts", fmt.Sprintf("           CPU0\n  9:          0  %sIO-APIC   9-fasteoi   acpi\n 30:         12  %sPCI-MSIX-0000:00:01.0   0-edge      nvme0q0\nNMI:          0   Non-maskable interrupts\n", p, p))
}

// KVM creates dev/kvm (a plain file: presence is all host checks).
func (tr *Tree) KVM() { tr.Write("dev/kvm", "") }

// Device describes a PCI function to create.
type Device struct {
	BDF      string
	Vendor   uint16
	DeviceID uint16
	Class    uint32
	// Driver is the bound driver, "" for none.
	Driver string
	// NUMANode is written to numa_node (-1 for none).
	NUMANode int
	// IOMMUGroup links the device into /sys/kernel/iommu_groups/N; -1 for
	// no group.
	IOMMUGroup int
	// ResetMethod is written to reset_method unless empty (then the file is
	// absent, as the kernel hides it for devices without reset).
	ResetMethod string
	// Resource is the sysfs resource file contents; empty writes 13 empty
	// lines.
	Resource string
	// Config is the config space; nil writes a minimal 256-byte header
	// with the IDs and no capabilities.
	Config []byte
}

// AddDevice creates the device directory with IDs, driver, NUMA node, IOMMU
// group, reset method, resources and config space.
func (tr *Tree) AddDevice(d Device) {
	tr.t.Helper()
	dir := "sys/bus/pci/devices/" + d.BDF
	tr.Write(dir+"/vendor", fmt.Sprintf("0x%04x\n", d.Vendor))
	tr.Write(dir+"/device", fmt.Sprintf("0x%04x\n", d.DeviceID))
	tr.Write(dir+"/class", fmt.Sprintf("0x%06x\n", d.Class))
	tr.Write(dir+"/numa_node", fmt.Sprintf("%d\n", d.NUMANode))
	if d.Driver != "" {
		tr.mkdir("sys/bus/pci/drivers/" + d.Driver)
		tr.Symlink(dir+"/driver", "../../../bus/pci/drivers/"+d.Driver)
	}
	if d.IOMMUGroup >= 0 {
		g := fmt.Sprintf("sys/kernel/iommu_groups/%d", d.IOMMUGroup)
		tr.Symlink(dir+"/iommu_group", "../../../kernel/iommu_groups/"+fmt.Sprint(d.IOMMUGroup))
		tr.Symlink(g+"/devices/"+d.BDF, "../../../../bus/pci/devices/"+d.BDF)
	}
	if d.ResetMethod != "" {
		tr.Write(dir+"/reset_method", d.ResetMethod+"\n")
	}
	res := d.Resource
	if res == "" {
		res = strings.Repeat("0x0000000000000000 0x0000000000000000 0x0000000000000000\n", 13)
	}
	tr.Write(dir+"/resource", res)
	cfg := d.Config
	if cfg == nil {
		cfg = make([]byte, 256)
		binary.LittleEndian.PutUint16(cfg[0:], d.Vendor)
		binary.LittleEndian.PutUint16(cfg[2:], d.DeviceID)
	}
	tr.Write(dir+"/config", string(cfg))
}

// LinkVF makes vf the n-th virtual function of pf: pf/virtfnN -> vf,
// vf/physfn -> pf, and pf/sriov_numvfs updated to n+1 if larger.
func (tr *Tree) LinkVF(pf, vf string, n int) {
	tr.t.Helper()
	tr.Symlink(fmt.Sprintf("sys/bus/pci/devices/%s/virtfn%d", pf, n), "../"+vf)
	tr.Symlink(fmt.Sprintf("sys/bus/pci/devices/%s/physfn", vf), "../"+pf)
	tr.Write(fmt.Sprintf("sys/bus/pci/devices/%s/sriov_numvfs", pf), fmt.Sprintf("%d\n", n+1))
	tr.Write(fmt.Sprintf("sys/bus/pci/devices/%s/sriov_totalvfs", pf), "8\n")
}

// ResourceLine formats one "start end flags" line of a resource file for a
// memory BAR of size bytes at start.
func ResourceLine(start, size uint64, mem64, prefetch bool) string {
	flags := uint64(0x200)
	if mem64 {
		flags |= 0x100000 | 0x4
	}
	if prefetch {
		flags |= 0x2000 | 0x8
	}
	return fmt.Sprintf("0x%016x 0x%016x 0x%016x\n", start, start+size-1, flags)
}

// Resource builds a 13-line resource file with the given lines at their
// indexes and empty lines elsewhere.
func Resource(lines map[int]string) string {
	var b strings.Builder
	for i := 0; i < 13; i++ {
		if l, ok := lines[i]; ok {
			b.WriteString(l)
		} else {
			b.WriteString("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
		}
	}
	return b.String()
}

// CPU writes /sys/devices/system/cpu/cpuN's topology (package, core) and
// a last-level cache (level 3) shared by the CPUs in llcShared ("0-7").
func (tr *Tree) CPU(n, pkg, core int, llcShared string) {
	tr.t.Helper()
	dir := fmt.Sprintf("sys/devices/system/cpu/cpu%d", n)
	tr.Write(dir+"/topology/physical_package_id", fmt.Sprintf("%d\n", pkg))
	tr.Write(dir+"/topology/core_id", fmt.Sprintf("%d\n", core))
	tr.Write(dir+"/cache/index0/level", "1\n")
	tr.Write(dir+"/cache/index0/shared_cpu_list", fmt.Sprintf("%d\n", n))
	tr.Write(dir+"/cache/index3/level", "3\n")
	tr.Write(dir+"/cache/index3/shared_cpu_list", llcShared+"\n")
}

// VFIOGroupFile creates dev/vfio/N, the group's character device on a live
// host (a plain file here: tests only open it).
func (tr *Tree) VFIOGroupFile(group int) {
	tr.t.Helper()
	tr.Write(fmt.Sprintf("dev/vfio/%d", group), "")
}

// Dev is the /dev directory of the tree.
func (tr *Tree) Dev() string { return filepath.Join(tr.Root, "dev") }

// NetInterface gives PCI function bdf a network interface name of ARPHRD
// type typ (32 InfiniBand, 1 Ethernet), as its net/<name>/type.
func (tr *Tree) NetInterface(bdf, name string, typ int) {
	tr.t.Helper()
	tr.Write(fmt.Sprintf("sys/bus/pci/devices/%s/net/%s/type", bdf, name), fmt.Sprintf("%d\n", typ))
}

// RDMADevice gives PCI function bdf an RDMA device dev whose port 1 has
// the link layer ("InfiniBand" or "Ethernet").
func (tr *Tree) RDMADevice(bdf, dev, linkLayer string) {
	tr.t.Helper()
	tr.Write(fmt.Sprintf("sys/bus/pci/devices/%s/infiniband/%s/ports/1/link_layer", bdf, dev), linkLayer+"\n")
}

// AddDeviceUnder creates d the way the kernel lays out a function below
// PCIe ports: its directory at sys/devices/pciDDDD:BB/<ancestors...>/<BDF>
// (ancestors are BDFs from the root port down, each added before, with
// AddDeviceUnder, if the test reads them) and sys/bus/pci/devices/<BDF> a
// symlink to it, so the device's realpath shows its upstream bridges. With
// no ancestors the device is on the root bus.
func (tr *Tree) AddDeviceUnder(d Device, ancestors ...string) {
	tr.t.Helper()
	top := d.BDF
	if len(ancestors) > 0 {
		top = ancestors[0]
	}
	rc := "pci" + top[:7] // "0000:00" of "0000:00:01.0"
	rel := "sys/devices/" + rc + "/" + strings.Join(append(append([]string(nil), ancestors...), d.BDF), "/")
	tr.mkdir(rel)
	tr.Symlink("sys/bus/pci/devices/"+d.BDF, "../../../devices/"+strings.TrimPrefix(rel, "sys/devices/"))
	tr.AddDevice(d)
}

// Link writes function bdf's max_link_speed/max_link_width (speed as the
// kernel writes it, e.g. "16.0 GT/s PCIe") and current_link_speed/width
// (the same: a fully trained link).
func (tr *Tree) Link(bdf, speed string, width int) {
	tr.t.Helper()
	dir := "sys/bus/pci/devices/" + bdf
	tr.Write(dir+"/max_link_speed", speed+"\n")
	tr.Write(dir+"/current_link_speed", speed+"\n")
	tr.Write(dir+"/max_link_width", fmt.Sprintf("%d\n", width))
	tr.Write(dir+"/current_link_width", fmt.Sprintf("%d\n", width))
}

// ClassNet gives PCI function bdf a network interface name in its
// directory at rel/name (rel "net" for a NIC's own, "virtio2/net" for
// virtio-net) with the IFF_* flags (0x1003: up, broadcast, multicast) and
// type 1, and links sys/class/net/name to it, as the kernel does.
func (tr *Tree) ClassNet(bdf, rel, name string, flags uint) {
	tr.t.Helper()
	dir := fmt.Sprintf("sys/bus/pci/devices/%s/%s/%s", bdf, rel, name)
	tr.Write(dir+"/flags", fmt.Sprintf("%#x\n", flags))
	tr.Write(dir+"/type", "1\n")
	tr.Symlink("sys/class/net/"+name, "../../bus/pci/devices/"+bdf+"/"+rel+"/"+name)
}

// ClassBlock gives PCI function bdf a block device name (a disk or a
// partition) in its directory at rel/name (rel "nvme/nvme0" for a disk,
// "nvme/nvme0/nvme0n1" for its partition) with device number devnum
// ("259:1") and the holders given (dm-0, md0), and links
// sys/class/block/name to it.
func (tr *Tree) ClassBlock(bdf, rel, name, devnum string, holders ...string) {
	tr.t.Helper()
	dir := fmt.Sprintf("sys/bus/pci/devices/%s/%s/%s", bdf, rel, name)
	tr.Write(dir+"/dev", devnum+"\n")
	tr.mkdir(dir + "/holders")
	for _, h := range holders {
		tr.Symlink(dir+"/holders/"+h, "../../../../../../virtual/block/"+h)
	}
	tr.Symlink("sys/class/block/"+name, "../../bus/pci/devices/"+bdf+"/"+rel+"/"+name)
}
