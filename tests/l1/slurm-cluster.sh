# Starts a real Slurm cluster on loopback inside L1 (profile slurm): munged,
# slurmctld and two slurmd (-N n1, -N n2) on 127.0.0.1, with proctrack/cgroup,
# task/cgroup, select/cons_tres and ConstrainDevices=yes on cgroup v1, and a
# gres.conf that declares the GPU stand-in (edu) as gpu and the VF stand-in
# (the NVMe VF) as nic by their /dev/vfio/<group> files. Sourced by the slurm
# profile's setup (busybox sh, set -e) after both devices are on vfio-pci:
# slurmd stats each gres.conf File= when it starts (its device numbers are
# what the cgroup's device list denies), so the groups must exist by then.
#
# In: GPU_GROUP, NIC_GROUP (the two devices' VFIO groups), SLURM_BRIDGE and
# SLURM_BRIDGE_ADDR, and the jobs' unprivileged user (SLURM_TEST_USER,
# SLURM_TEST_UID, SLURM_KVM_GID). Out: /etc/slurm (slurm.conf, gres.conf,
# cgroup.conf, the Prolog and Epilog of docs/slurm.md in prolog.d and
# epilog.d), logs under /var/log/slurm and /var/log/munge, the daemons
# running. L1 has no systemd: the daemons are
# started here, as root (SlurmUser=root; munged with --force, since its
# ownership checks expect a munge user that the initramfs does not need).

: "${GPU_GROUP:?}" "${NIC_GROUP:?}"

# Name resolution and loopback: slurmctld checks SlurmctldHost against
# gethostname(), and slurmd/srun resolve node and controller names. Slurm
# resolves its listening address with getaddrinfo(AI_ADDRCONFIG), which
# finds nothing while loopback is the only interface with an IPv4 address:
# the bridge the two nodes' VMs share (SLURM_BRIDGE, SLURM_BRIDGE_ADDR)
# carries one.
: "${SLURM_BRIDGE:?}" "${SLURM_BRIDGE_ADDR:?}"
mkdir -p /etc
ip link set lo up
ip link add "$SLURM_BRIDGE" type bridge
ip addr add "$SLURM_BRIDGE_ADDR" dev "$SLURM_BRIDGE"
ip link set "$SLURM_BRIDGE" up
hostname localhost
cat >/etc/hosts <<'EOF'
127.0.0.1 localhost
EOF
: "${SLURM_TEST_USER:?}" "${SLURM_TEST_UID:?}" "${SLURM_KVM_GID:?}"
# The jobs' user: slurmctld and slurmd look the job's uid up, slurmstepd
# gives the step the user's groups from /etc/group (initgroups), and munge
# authenticates any local uid. /dev/kvm is the kvm group's, as a node's udev
# rule makes it, and the user is in that group.
cat >/etc/passwd <<EOF
root:x:0:0:root:/tmp:/bin/sh
$SLURM_TEST_USER:x:$SLURM_TEST_UID:$SLURM_TEST_UID:job user:/home/$SLURM_TEST_USER:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >/etc/group <<EOF
root:x:0:
$SLURM_TEST_USER:x:$SLURM_TEST_UID:
kvm:x:$SLURM_KVM_GID:$SLURM_TEST_USER
nogroup:x:65534:
EOF
mkdir -p /home/$SLURM_TEST_USER
chown $SLURM_TEST_UID:$SLURM_TEST_UID /home/$SLURM_TEST_USER
chmod 755 /home /home/$SLURM_TEST_USER
chown root:kvm /dev/kvm
chmod 660 /dev/kvm
# L1 has devtmpfs but no udev: /dev/net/tun is 0600 there. udev's default
# rules (50-udev-default.rules: KERNEL=="tun", MODE="0666") open it to
# every user, so that a TAP's owner can attach to it (TUNSETIFF).
chmod 666 /dev/net/tun
# hpcvmm where a site installs it: the Prolog and Epilog call it by name.
ln -sf /hpcvmm/bin/hpcvmm /usr/sbin/hpcvmm
echo 'passwd: files
group: files
hosts: files' >/etc/nsswitch.conf

# cgroup v1 controllers, each on its own hierarchy as Slurm's cgroup/v1
# plugin expects under CgroupMountpoint. Nothing else in L1 mounts cgroups,
# so the v1 hierarchies get the controllers.
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for c in cpuset memory devices freezer cpuacct; do
	mkdir -p /sys/fs/cgroup/$c
	mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
done

mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge \
	/etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chmod 700 /etc/munge /var/lib/munge
chmod 755 /run/munge
dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
chmod 400 /etc/munge/munge.key

# Both nodes are this L1. With one CPU they share it; with two (the bench's
# MPI L1) each node reserves the other's CPU for system use (CpuSpecList),
# so that, with ConstrainCores, a step on n1 runs on CPU 0 and one on n2 on
# CPU 1, as on two real nodes.
if [ "$(grep -c ^processor /proc/cpuinfo)" -ge 2 ]; then
	SLURM_NODE_LINES="NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17011 CPUs=2 CpuSpecList=1 RealMemory=2048 Gres=gpu:1,nic:1 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17012 CPUs=2 CpuSpecList=0 RealMemory=2048 Gres=gpu:1,nic:1 State=UNKNOWN"
else
	SLURM_NODE_LINES="NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17011-17012] CPUs=1 RealMemory=2048 Gres=gpu:1,nic:1 State=UNKNOWN"
fi

cat >/etc/slurm/slurm.conf <<EOF
ClusterName=hpcvmm
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=17010
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu,nic
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
ReturnToService=2
# Both nodes are this one L1: take the node lines as given.
SlurmdParameters=config_overrides
# L1 is emulated and shares a loaded machine: a step launch took longer than
# the default 10 s MessageTimeout there. Generous limits keep slowness from
# looking like a dead node.
MessageTimeout=100
InactiveLimit=0
KillWait=30
MinJobAge=30
SlurmdTimeout=600
$SLURM_NODE_LINES
PartitionName=vm Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
# The Prolog, the Epilog and their slurm.conf lines as docs/slurm.md gives
# them (packed from the document by tests/harness, slurmprolog.go, with the
# few changes L1 needs: its bridge, its nic that is not InfiniBand, a TAP
# name per node since both nodes are this host).
mkdir -p /etc/slurm/prolog.d /etc/slurm/epilog.d
cp /hpcvmm/slurm/prolog.sh /etc/slurm/prolog.d/hpcvmm.sh
cp /hpcvmm/slurm/epilog.sh /etc/slurm/epilog.d/hpcvmm.sh
chmod 755 /etc/slurm/prolog.d/hpcvmm.sh /etc/slurm/epilog.d/hpcvmm.sh
cat /hpcvmm/slurm/slurm.conf.docs >>/etc/slurm/slurm.conf
# AutoDetect=nvml cannot see devices on vfio-pci: declare them by group.
cat >/etc/slurm/gres.conf <<EOF
# The GPU and the InfiniBand VF stand-ins, by their VFIO groups.
AutoDetect=off
Name=gpu File=/dev/vfio/$GPU_GROUP
Name=nic File=/dev/vfio/$NIC_GROUP
EOF
cat >/etc/slurm/cgroup.conf <<'EOF'
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainCores=yes
ConstrainDevices=yes
ConstrainRAMSpace=no
EOF

munged --force --num-threads=2 >/var/log/munge/start.log 2>&1 ||
	{ cat /var/log/munge/start.log /var/log/munge/munged.log 2>/dev/null; echo "munged did not start"; exit 1; }
munge -n | unmunge >/dev/null || { echo "munge round trip failed"; exit 1; }
slurmctld || { tail -20 /var/log/slurm/slurmctld.log; echo "slurmctld did not start"; exit 1; }
for n in n1 n2; do
	slurmd -N $n || { tail -20 /var/log/slurm/slurmd-$n.log; echo "slurmd -N $n did not start"; exit 1; }
done
# Wait (bounded) for both nodes to register idle.
i=0
until [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" -eq 2 ]; do
	i=$((i + 1))
	if [ $i -gt 240 ]; then
		sinfo -N -l 2>&1
		tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-n1.log /var/log/slurm/slurmd-n2.log
		echo "Slurm nodes n1, n2 not idle after 120 s"
		exit 1
	fi
	sleep 0.5
done
echo "L1 setup: Slurm cluster up after $i half-seconds: $(sinfo -h -N -o '%N:%t:%G' | tr '\n' ' ')"
