package harness

import "os"

// ProfileTripleFault is ProfileCores with QEMU in its L1, for issue 36's
// experiment (TestL2TripleFaultRate): the same L2 guests started two at
// once by hpcvmm and, as the control, by QEMU (-accel kvm -cpu host) in
// the same L1 boot.
var ProfileTripleFault = func() Profile {
	p := cpuProfile("triplefault", "cores=2")
	p.Files = AddQEMU
	return p
}()

func init() { Profiles = append(Profiles, ProfileTripleFault) }

// L1QEMU is where AddQEMU puts QEMU in L1.
const L1QEMU = "/usr/bin/qemu-system-x86_64"

// QEMUFirmware are the firmware files QEMU loads for the machines the
// test bed boots as L2 (SeaBIOS for q35, qboot for microvm, the option
// ROMs of direct kernel boot), at the paths Debian's QEMU searches.
var QEMUFirmware = []string{
	"/usr/share/seabios/bios-256k.bin",
	"/usr/share/qemu/bios-microvm.bin",
	"/usr/share/qemu/qboot.rom",
	"/usr/share/qemu/linuxboot_dma.bin",
	"/usr/share/qemu/linuxboot.bin",
	"/usr/share/qemu/kvmvapic.bin",
	"/usr/share/qemu/multiboot_dma.bin",
	"/usr/share/qemu/pvh.bin",
}

// AddQEMU puts this host's QEMU (with its libraries) and QEMUFirmware into
// an L1 image, at L1QEMU.
func AddQEMU(im *Image) error {
	q, err := qemuPath()
	if err != nil {
		return err
	}
	if q != L1QEMU {
		im.AddFile(L1QEMU, q, 0o755)
	}
	if err := im.AddDynamicProgram(q); err != nil {
		return err
	}
	for _, f := range QEMUFirmware {
		if _, err := os.Stat(f); err == nil {
			im.AddFile(f, f, 0o644)
		}
	}
	return nil
}
