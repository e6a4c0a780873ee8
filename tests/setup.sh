#!/usr/bin/env bash
# Installs the Debian packages the integration harness (tests/harness) needs:
# QEMU for the nested L1 test bed, Debian's stock kernel (L1 and L2 kernel and
# modules), busybox-static and nvme-cli for the initramfs images, kmod for
# `modprobe --show-depends`, gcc for uapi's ABI conformance test, Slurm and
# munge for the loopback cluster of the Slurm scenarios.
# Idempotent: when everything is installed it changes nothing and needs no
# network. Runs as root (CI) or through sudo.
set -euo pipefail

packages=(
	qemu-system-x86 # qemu-system-x86_64: L1 under TCG
	linux-image-amd64 # /boot/vmlinuz-* and /lib/modules/*: L1 and L2 kernel
	busybox-static # /init userland of L1 and L2
	cpio           # cross-check of the harness's newc writer
	nvme-cli       # NVMe SR-IOV VF setup inside L1
	kmod           # modprobe --show-depends
	libc-bin       # ldd, to collect nvme-cli's libraries
	xz-utils       # decompresses .ko.xz modules of newer kernels
	iproute2 ethtool # TAP / NIC setup in scenarios
	strace           # ibvf: captures the netlink messages for VF GUIDs sent to a veth
	gcc libc6-dev    # uapi ABI conformance test (compiles C)
	make linux-headers-amd64 # builds the L2 guest's edu MSI test module (tests/guest/edumsi)
	ca-certificates  # go module downloads over HTTPS
	acpica-tools # iasl: acpi package's byte-exact AML vectors and table disassembly
	slurmctld slurmd slurm-client munge # the loopback Slurm cluster packed into L1 (profile slurm)
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]} > 0)); then
	sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || { echo "setup.sh: not root and no sudo; install as root: ${missing[*]}" >&2; exit 1; }
		sudo=(sudo)
	fi
	echo "setup.sh: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update
	"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
else
	echo "setup.sh: all packages present (${#packages[@]})"
fi

# The harness needs a kernel image together with its modules.
found=
for img in /boot/vmlinuz-*; do
	[[ -e $img && -e /lib/modules/${img#/boot/vmlinuz-}/modules.dep ]] && found=$img
done
if [[ -z $found ]]; then
	echo "setup.sh: no /boot/vmlinuz-VERSION with /lib/modules/VERSION/modules.dep after installing linux-image-amd64" >&2
	exit 1
fi
echo "setup.sh: kernel $found"
command -v qemu-system-x86_64 >/dev/null || { echo "setup.sh: qemu-system-x86_64 missing" >&2; exit 1; }
