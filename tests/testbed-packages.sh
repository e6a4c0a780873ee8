#!/usr/bin/env bash
# Installs the Debian packages the test bed (tests/harness, the unit tests
# that compile C or run iasl) needs. hpcvmm itself needs none of them: the
# README's quick start runs without this script.
#
#   QEMU for the nested L1 test bed, Debian's generic kernel (L1 and L2
#   kernel and modules), busybox-static and nvme-cli for the initramfs
#   images, kmod for `modprobe --show-depends`, gcc for uapi's ABI
#   conformance test, Slurm and munge for the loopback cluster of the Slurm
#   scenarios, MPICH and dnsmasq for the job and network scenarios.
#
# It never enables or starts a service. Debian's slurmd, slurmctld and munge
# enable themselves at boot when installed ("Created symlink
# .../multi-user.target.wants/slurmd.service"): on an HPC node that runs the
# site's own Slurm that is the last thing wanted. So the install runs under a
# policy-rc.d that refuses every start (exit 101, invoke-rc.d(8)), and every
# boot link the install created is removed again (systemctl disable where
# systemd runs, the links themselves otherwise; update-rc.d disable for SysV
# links), which Debian's maintainer scripts respect on upgrades. The tests
# start the daemons they need themselves, inside L1.
#
# Idempotent: when everything is installed it changes nothing and needs no
# network. Runs as root (CI) or through sudo.
set -euo pipefail

packages=(
	qemu-system-x86 # qemu-system-x86_64: L1 under TCG
	linux-image-amd64 # /boot/vmlinuz-* and /lib/modules/*: L1 and L2 kernel (generic flavour)
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
	mpich libmpich-dev # MPI jobs in the guest (job scenarios)
	dnsmasq-base       # DHCP/DNS for the guest network scenarios (the binary only: no service)
	squashfs-tools erofs-utils # mksquashfs, mkfs.erofs: imagefile's tests build real SquashFS/EROFS images (issue 31)
)

# Packages that are programs and shared libraries only (no maintainer script
# that matters, no service), each with a command that proves it is there.
# When dpkg itself cannot install (CI's image and this project's
# workstations have an /var/lib/dpkg/statoverride entry for a group that no
# longer exists, and dpkg aborts on it before unpacking anything), these are
# unpacked into /usr/local with dpkg-deb -x instead: dpkg's database and
# statoverride are left as they are, and the programs still work.
declare -A unpackable=(
	[squashfs-tools]=mksquashfs
	[erofs-utils]=mkfs.erofs
)

# Units of the packages above that enable themselves at boot when installed;
# named in the note about ones found enabled that this run did not install.
boot_units=(slurmd slurmctld munge)

say() { echo "testbed-packages.sh: $*"; }

# boot_links lists the links that start something at boot: systemd's
# *.wants/*.requires directories and SysV's S links.
boot_links() {
	find /etc/systemd/system -mindepth 2 -maxdepth 2 -type l \
		\( -path '*.wants/*' -o -path '*.requires/*' \) 2>/dev/null
	find /etc/rc[S0-6].d -maxdepth 1 -type l -name 'S*' 2>/dev/null
}

# unpack_into_usr_local downloads the packages named and the shared
# libraries they need that this machine lacks, and copies their programs to
# /usr/local/bin and their libraries to /usr/local/lib (then ldconfig).
unpack_into_usr_local() {
	local work deb p lib
	work=$(mktemp -d)
	# The packages' own dependencies, less those installed already.
	local want=("$@")
	for p in "$@"; do
		while read -r dep; do
			dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q '^install ok installed$' || want+=("$dep")
		done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$p" |
			sed -n 's/^ *Depends: \([^<> ]*\)$/\1/p')
	done
	(cd "$work" && apt-get download "${want[@]}" >/dev/null)
	for deb in "$work"/*.deb; do
		dpkg-deb -x "$deb" "$work/root"
	done
	for p in "$work"/root/usr/bin/* "$work"/root/usr/sbin/* "$work"/root/sbin/*; do
		[[ -f $p ]] && "${sudo[@]}" install -m 0755 "$p" /usr/local/bin/
	done
	for lib in "$work"/root/usr/lib/x86_64-linux-gnu/*.so* "$work"/root/lib/x86_64-linux-gnu/*.so*; do
		[[ -e $lib ]] && "${sudo[@]}" cp -a "$lib" /usr/local/lib/
	done
	"${sudo[@]}" ldconfig
	rm -rf "$work"
	for p in "$@"; do
		command -v "${unpackable[$p]}" >/dev/null || { say "$p: ${unpackable[$p]} still missing after unpacking it" >&2; exit 1; }
		say "unpacked $p into /usr/local (${unpackable[$p]}: $(command -v "${unpackable[$p]}"))"
	done
}

missing=()
for p in "${packages[@]}"; do
	if [[ -n ${unpackable[$p]:-} ]] && command -v "${unpackable[$p]}" >/dev/null; then
		continue
	fi
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]} > 0)); then
	sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || { say "not root and no sudo; install as root: ${missing[*]}" >&2; exit 1; }
		sudo=(sudo)
	fi
	say "installing ${missing[*]}"

	before=$(mktemp) after=$(mktemp) policy_backup=$(mktemp -u)
	policy=/usr/sbin/policy-rc.d
	restore_policy() {
		if [[ -e $policy_backup ]]; then
			"${sudo[@]}" mv -f "$policy_backup" "$policy"
		else
			"${sudo[@]}" rm -f "$policy"
		fi
		rm -f "$before" "$after"
	}
	# The site's own policy-rc.d, if any, is put back on every exit path.
	if [[ -e $policy ]]; then
		"${sudo[@]}" cp -a "$policy" "$policy_backup"
	fi
	trap restore_policy EXIT
	printf '#!/bin/sh\n# tests/testbed-packages.sh: no service starts during the install.\nexit 101\n' |
		"${sudo[@]}" tee "$policy" >/dev/null
	"${sudo[@]}" chmod 0755 "$policy"

	boot_links | sort >"$before"
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update
	if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"; then
		unpack=() rest=()
		for p in "${missing[@]}"; do
			if [[ -n ${unpackable[$p]:-} ]]; then unpack+=("$p"); else rest+=("$p"); fi
		done
		if ((${#rest[@]} > 0)); then
			say "apt-get install failed (see above) for packages that must be installed by dpkg: ${rest[*]}" >&2
			exit 1
		fi
		say "apt-get install failed (see above); unpacking ${unpack[*]} into /usr/local instead (dpkg's database is left as it is)"
		unpack_into_usr_local "${unpack[@]}"
	fi
	boot_links | sort >"$after"

	# Every boot link the install created is undone, once per service.
	declare -A units=() sysv=()
	while read -r link; do
		name=$(basename "$link")
		case $link in
		/etc/systemd/system/*) units[$name]=1; "${sudo[@]}" rm -f "$link" ;;
		*) sysv[${name#S[0-9][0-9]}]=1 ;;
		esac
	done < <(comm -13 "$before" "$after")
	for u in "${!units[@]}"; do
		# With systemd running, let it forget the unit too (the links are
		# gone already, so this only clears its state).
		if [[ -d /run/systemd/system ]]; then
			"${sudo[@]}" systemctl disable --quiet "$u" || true
		fi
		say "disabled at boot: $u (its package enabled it)"
	done
	for s in "${!sysv[@]}"; do
		# K links instead of none, so that a later update-rc.d defaults
		# (a package upgrade) keeps it disabled.
		"${sudo[@]}" update-rc.d "$s" disable >/dev/null 2>&1 || true
		"${sudo[@]}" rm -f /etc/rc[S0-6].d/S[0-9][0-9]"$s"
		say "disabled at boot (SysV): $s (its package enabled it)"
	done

	# Leftovers: a boot link this install created that is still there fails.
	boot_links | sort >"$after"
	left=$(comm -13 "$before" "$after")
	if [[ -n $left ]]; then
		say "boot links created by the install are still there:" >&2
		echo "$left" >&2
		exit 1
	fi
	if [[ -d /run/systemd/system ]]; then
		"${sudo[@]}" systemctl daemon-reload
	fi
else
	say "all packages present (${#packages[@]})"
fi

# Units of test-bed packages enabled before this run (by the site, or by an
# older tests/setup.sh): this script leaves them as they are, but says so.
enabled=()
for u in "${boot_units[@]}"; do
	if compgen -G "/etc/systemd/system/*.wants/$u.service" >/dev/null || compgen -G "/etc/rc[2-5].d/S[0-9][0-9]$u" >/dev/null; then
		enabled+=("$u")
	fi
done
if ((${#enabled[@]} > 0)); then
	say "note: ${enabled[*]} enabled at boot, not by this run; the tests do not need that (systemctl disable ${enabled[*]}; or update-rc.d NAME disable without systemd)"
fi

# The harness needs a kernel image together with its modules; it prefers the
# generic flavour (tests/harness FindKernel) and logs which it chose.
found=
for img in /boot/vmlinuz-*; do
	[[ -e $img && -e /lib/modules/${img#/boot/vmlinuz-}/modules.dep ]] && found+=" $img"
done
if [[ -z $found ]]; then
	say "no /boot/vmlinuz-VERSION with /lib/modules/VERSION/modules.dep after installing linux-image-amd64" >&2
	exit 1
fi
say "kernels:$found"
command -v qemu-system-x86_64 >/dev/null || { say "qemu-system-x86_64 missing" >&2; exit 1; }
