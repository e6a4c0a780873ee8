// Package harness runs hpcvmm's integration scenarios on real KVM, either
// directly on the host (when /dev/kvm is usable) or inside an "L1" Linux guest
// booted under QEMU's software emulation, which provides a working /dev/kvm,
// an emulated IOMMU and emulated PCI devices (see docs/testbed.md).
//
// Scenarios are ordinary Go tests in package tests (build tag integration).
// Each one is written as
//
//	func TestSomething(t *testing.T) {
//		harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
//			// runs on a machine with /dev/kvm: the host, or inside L1
//		})
//	}
//
// Where the body runs is chosen by HPCVMM_TEST_WHERE:
//
//   - auto (default): host when /dev/kvm is usable and the profile's devices
//     are present on the host, otherwise l1;
//   - host: run the body here (skips when /dev/kvm is not usable);
//   - l1: boot one L1 guest per profile and run the body inside it;
//   - inside: set by the L1 /init; the body runs locally and its outcome is
//     written as result records to the dedicated serial port.
//
// In l1 mode the test binary itself is the scenario runner inside L1: the
// harness builds a static copy of the test binary, puts it into the L1
// initramfs together with busybox, kernel modules, nvme-cli, hpcvmm and the
// L2 kernel and initramfs, and boots L1 once per profile (sync.Once), running
// the same -test.run filter inside. A profile with Files or Modules (the
// slurm profile: Slurm, munge and the bridge module) boots an image of its
// own, l1-NAME.cpio, the common one plus those. Result records ("hpcvmm-result ...") come
// back on L1's second serial port and are parsed on the outer side; the first
// serial port carries the human-readable `go test -v` output.
//
// The L1 and L2 initramfs images (Image) are newc cpio archives written with
// u-root's pkg/cpio (github.com/u-root/u-root), the library the design names
// for test initramfs images, rather than a cpio writer of the harness's own;
// the harness adds only entry order and fixed metadata (cpio.go) and checks
// the result with an independent decoder and the system cpio(1).
//
// An L1 that writes nothing to either port for HPCVMM_L1_STALL is killed
// (its CPU registers saved from the QEMU monitor) and booted once more for
// the scenarios that had no outcome yet; a scenario run in that second boot
// says so in its log, and one that hangs L1 again fails. The emulated L1
// itself hangs now and then (QEMU 7.2 TCG loses its timer wakeup).
//
// Environment variables:
//
//   - HPCVMM_TEST_WHERE: auto | host | l1 | inside (see above).
//   - HPCVMM_REQUIRE_INTEGRATION=1: a missing QEMU, a missing /dev/kvm in host
//     mode and a scenario skipped inside L1 are failures instead of skips (CI).
//   - HPCVMM_TEST_CACHE: build directory (default: os.UserCacheDir()/hpcvmm-tests).
//   - HPCVMM_TEST_KERNEL: the L1 and L2 kernel (default: newest /boot/vmlinuz-*
//     that has modules in /lib/modules).
//   - HPCVMM_L1_TIMEOUT: limit for one L1 boot (Go duration, default 15m,
//     capped by the go test deadline).
//   - HPCVMM_L1_STALL: how long L1 may be silent before it counts as hung
//     (Go duration, default 8m).
//   - HPCVMM_L1_SMP: L1 vCPU count, overriding the profile's.
//   - HPCVMM_VM_TIMEOUT: limit for one hpcvmm process started by Env.StartVM
//     (default 4m).
package harness
