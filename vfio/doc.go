// Package vfio passes host PCI functions through to the guest with VFIO:
// host-side checks (IOMMU group viability, SR-IOV VF → PF), opening the
// device from its group in the VM's shared iommu.Container, the KVM-VFIO
// pseudo device, and the passthrough device model (PCIDevice) that plugs
// into package pci's root complex.
//
// The model virtualises configuration space over the device's real one: the
// identity registers, BARs (sized from VFIO region info), the ROM BAR
// (disabled), the capability pointers, MSI and MSI-X are emulated; every
// other register is read from and written to the device through the VFIO
// config region. BARs are mmapped from their VFIO regions and installed as
// KVM memslots (through the Memslots interface) so guest accesses cause no
// exits; only the pages holding the MSI-X table and PBA stay trapped, where
// table accesses are emulated and everything else is forwarded with
// pread/pwrite. Interrupts never pass through hpcvmm: MSI-X and MSI vectors
// are VFIO eventfds bound to KVM GSIs with irqfds (irq.Vectors, which
// deassigns before re-routing on mask and routes before assigning on
// unmask), and INTx is a VFIO trigger eventfd bound with a resampling irqfd
// whose resample eventfd is VFIO's unmask eventfd.
//
// Wiring order for a VMM (see also the report in the package's history):
//
//  1. hoststate: Bind each device when --bind-devices is given (defer Restore).
//  2. Check each device (CheckDevice): exists, IOMMU on, group viable,
//     bound to vfio-pci, VF has a PF when --vf.
//  3. iommu.Open, NewKVMVFIO(vm).
//  4. OpenDevice for each (adds its group to the container and to KVM).
//  5. container.MapGuestRAM(mem.Regions()) — after the first group, since
//     the IOMMU type is set then.
//  6. NewPCIDevice for each, Root.AddDevice, Root.AssignBARs: BARMapped
//     installs the memslots and (with P2P) the BAR DMA mappings.
//  7. On exit: PCIDevice.Close, KVMVFIO.Close, container.Close, Restore.
package vfio
