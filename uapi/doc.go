// Package uapi is hpcvmm's single binding to the kernel's binary interfaces:
// the KVM ioctls and the structures they exchange (and, later, VFIO, vhost
// and TUN), typed file-descriptor handles (System, VM, VCPU), the mmapped
// struct kvm_run, and the few raw system calls golang.org/x/sys/unix lacks
// (mbind). It also holds the atomic 16-bit accesses to memory shared with
// the guest (guestatomic.go): they need a pointer conversion, and this is
// the package allowed one.
//
// It is the only package in the project that imports unsafe or spells an
// ioctl number. Everything above it (vmm, boot, guestmem, the integration
// harness) works with plain Go values and methods, so a layout mistake can
// only live here, where the ABI conformance test (abi_test.go) compiles a C
// program against /usr/include/linux/kvm.h with gcc and compares every
// struct size, field offset, ioctl number and constant with the Go mirror.
//
// Why hand-written rather than a dependency: gokvm's bindings lack irqfd,
// ioeventfd and MSI routing and declare a 24-byte kvm_irq_routing_entry (the
// kernel's is 48 bytes, so KVM_SET_GSI_ROUTING would read garbage past the
// first entry); gVisor's abi packages cover only part of KVM and pull in a
// large dependency tree. The subset a direct-boot VMM needs is small enough
// to mirror by hand and verify mechanically.
//
// Conventions:
//   - Errors wrap the errno so errors.Is(err, unix.EINTR) and friends work,
//     and name the ioctl and its input: "kvm: KVM_IRQFD (fd 7, gsi 5): ...".
//   - Every ioctl is retried on EINTR except KVM_RUN, whose EINTR is how a
//     vCPU thread is kicked out of the guest (see VCPU.Run).
//   - The vCPU exit path (VCPU.Run and the Run accessors) allocates nothing.
//
// Only linux/amd64 is supported: the mirrors follow the x86-64 layouts.
package uapi
