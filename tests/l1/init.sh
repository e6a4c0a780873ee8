#!/bin/busybox sh
# L1's /init: prepares the L1 guest (a Linux under QEMU TCG with a working
# /dev/kvm) and runs the integration test binary inside it as the scenario
# runner. Result records go to the dedicated serial port /dev/ttyS1; the
# console (ttyS0) carries the human-readable `go test -v` output. Built into
# the L1 initramfs by tests/harness (build.go); see tests/harness/doc.go.
/bin/busybox mkdir -p /proc /sys /dev /tmp /bin /sbin /usr/bin /usr/sbin /run
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run && mkdir -p /run/hpcvmm
mkdir -p /dev/hugepages /dev/hugepages-2M
mount -t hugetlbfs -o pagesize=1G hugetlbfs /dev/hugepages 2>/dev/null ||
	mount -t hugetlbfs hugetlbfs /dev/hugepages
mount -t hugetlbfs -o pagesize=2M hugetlbfs /dev/hugepages-2M 2>/dev/null

RESULTS=/dev/ttyS1
# Raw mode: no newline translation or echo on the result port.
stty -F "$RESULTS" raw -echo 2>/dev/null
record() { echo "hpcvmm-result $*" >"$RESULTS"; }
# abort ends the boot early with a reason the outer side prints.
abort() {
	echo "L1 /init: $*"
	record l1=abort reason="\"$*\""
	poweroff -f
}

param() { sed -n "s/.*\\<$1=\\([^ ]*\\).*/\\1/p" /proc/cmdline; }
PROFILE=$(param hpcvmm.profile)
RUNCFG=$(param hpcvmm.run)
record l1=started uptime=$(cut -d' ' -f1 /proc/uptime) profile="$PROFILE"

[ -n "$PROFILE" ] || abort "no hpcvmm.profile= on the kernel command line"
if [ -n "$RUNCFG" ]; then
	echo "$RUNCFG" | base64 -d >/tmp/run.env || abort "hpcvmm.run= is not base64"
	. /tmp/run.env
fi

failed_modules=""
for m in $(cat /hpcvmm/modules.list); do
	insmod "$m" 2>/tmp/insmod.err || {
		grep -q 'File exists' /tmp/insmod.err || failed_modules="$failed_modules $(basename "$m")"
	}
done
# The profile's own modules (Profile.Modules), when it has any.
if [ -f "/hpcvmm/profiles/$PROFILE.modules" ]; then
	for m in $(cat "/hpcvmm/profiles/$PROFILE.modules"); do
		insmod "$m" 2>/tmp/insmod.err || {
			grep -q 'File exists' /tmp/insmod.err || failed_modules="$failed_modules $(basename "$m")"
		}
	done
fi
[ -z "$failed_modules" ] || echo "L1 /init: modules that failed to load:$failed_modules"
echo "L1 /init: profile $PROFILE, modules loaded, uptime $(cut -d' ' -f1 /proc/uptime) s"
[ -c /dev/kvm ] || abort "no /dev/kvm after loading kvm_amd (does QEMU's -cpu expose svm?)"
hp1g=$(cat /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages 2>/dev/null || echo 0)
record l1=kvm status=ok uptime=$(cut -d' ' -f1 /proc/uptime) hugepages_1g=$hp1g cpus=$(nproc) memtotal_kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)

# Profile setup (device binding, VFs, ...). Run in a subshell so `exit`
# in a profile cannot end /init; a non-zero status aborts the boot.
setup=/hpcvmm/profiles/$PROFILE.sh
[ -f "$setup" ] || abort "unknown profile $PROFILE (no $setup)"
(set -e; . "$setup") || abort "profile $PROFILE setup failed with status $?"
record l1=setup status=ok uptime=$(cut -d' ' -f1 /proc/uptime)
echo "L1 /init: profile setup done; running /hpcvmm/tests.test -test.run '${HPCVMM_RUN:-.}'"

export HPCVMM_TEST_WHERE=inside
export HPCVMM_TEST_PROFILE="$PROFILE"
export HPCVMM_TEST_RESULTS="$RESULTS"
export HPCVMM_TEST_L2_KERNEL=/hpcvmm/l2/vmlinuz
export HPCVMM_TEST_L2_INITRD=/hpcvmm/l2/initrd.cpio.gz
[ -x /hpcvmm/bin/hpcvmm ] && export HPCVMM_TEST_HPCVMM=/hpcvmm/bin/hpcvmm
export HOME=/tmp TMPDIR=/tmp
# Kernel messages would interleave with the test output; keep errors only.
echo 3 >/proc/sys/kernel/printk

cd /tmp
if [ -n "$HPCVMM_PROGRAM" ]; then
	# harness.RunL1Program: run another program (the benchmark suite)
	# instead of the scenarios; the outer side bounds it with its timeout.
	echo "L1 /init: running $HPCVMM_PROGRAM"
	"$HPCVMM_PROGRAM"
else
	/hpcvmm/tests.test -test.v -test.count=1 \
		-test.run "${HPCVMM_RUN:-.}" ${HPCVMM_SKIP:+-test.skip "$HPCVMM_SKIP"} \
		-test.timeout "${HPCVMM_TIMEOUT:-10m}"
fi
rc=$?
echo "L1 /init: scenario runner exited with status $rc, uptime $(cut -d' ' -f1 /proc/uptime) s; powering off"
record l1=exit code=$rc uptime=$(cut -d' ' -f1 /proc/uptime)
sync
poweroff -f
