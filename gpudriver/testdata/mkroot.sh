#!/bin/sh
# mkroot.sh rebuilds host/, the fake host root the tests select from, out of
# the captured files beside it (ldconfig-p.txt, finds.txt, version.txt,
# proc-devices.txt): every driver library path ldconfig-p.txt lists under
# /usr/local/nvidia/lib64 and /lib becomes a symbolic link to
# NAME-BASE.so.580.159.04 (a tiny regular file), as the driver's installer lays
# them out; /lib is a link to usr/lib (Ubuntu's merged /usr, which is why
# finds.txt sees /usr/lib/libcuda.so.1 where ldconfig says /lib/libcuda.so.1);
# the CUDA toolkit's forward-compatibility copies of finds.txt
# (/usr/local/cuda-13.0/compat, driver 580.95.05) and a few toolkit libraries
# exist too, so excluding them is tested on files that resolve. Made for the
# tests, not captured: the binaries in usr/bin (the fixture did not capture
# where nvidia-smi lives), the i386 copy of libcuda, and the capability files
# under proc/driver/nvidia/capabilities (minors and modes as dev-nodes.txt
# shows them: nvidia-cap1 0400, nvidia-cap2 0444), the kernel's release in
# proc/sys/kernel/osrelease (version.txt's uname -r), and the GSP firmware
# where the device H200 host keeps it (seen there for issue 32: the kernel's
# firmware_class.path is /usr/local/nvidia/firmware, holding
# nvidia/580.159.04/gsp_ga10x.bin, 74983408 bytes, and gsp_tu10x.bin,
# 30463064; nothing under /lib/firmware/nvidia), as tiny stand-ins. The
# guest kernel's nvidia.ko is a real ELF object (compiled with gcc -c, so
# this script needs gcc) whose .modinfo holds what that host's
# /usr/local/nvidia/modules/nvidia.ko holds of what hpcvmm reads, in its
# order: version=580.159.04, firmware= gsp_tu10x.bin then gsp_ga10x.bin,
# name=nvidia; the other modules are text stand-ins with the ELF magic. Left
# out on purpose:
# ocl-icd's libOpenCL.so development link, so the cache has a stale entry.
set -eu
cd "$(dirname "$0")"
rm -rf host
V=580.159.04
mkdir -p host/usr/lib host/usr/local/nvidia/lib64 host/etc host/proc/driver/nvidia host/usr/bin host/sys/module/nvidia
ln -s usr/lib host/lib
sed -n 2p version.txt > host/proc/driver/nvidia/version
echo "$V" > host/sys/module/nvidia/version
{ echo "Character devices:"; echo "  1 mem"; echo "  4 tty"; echo "  5 /dev/tty"; echo " 10 misc"
  cat proc-devices.txt; echo; echo "Block devices:"; echo "  7 loop"; echo "  8 sd"; echo "259 blkext"; } > host/proc/devices
grep -E '=> (/usr/local/nvidia/lib64|/lib)/[^/]+$' ldconfig-p.txt | awk '{print $NF}' | while read -r p; do
	d=$(dirname "$p"); n=$(basename "$p"); base=${n%%.so*}.so
	[ "$d" = /lib ] && d=/usr/lib
	real=$base.$V
	[ -e "host$d/$real" ] || printf 'fake %s\n' "$real" > "host$d/$real"
	[ "$n" = "$real" ] || ln -sf "$real" "host$d/$n"
done
# CUDA toolkit: forward-compatibility driver copies and libraries ldconfig-p.txt lists.
C=host/usr/local/cuda-13.0
mkdir -p $C/compat $C/targets/x86_64-linux/lib/stubs
ln -s cuda-13.0 host/usr/local/cuda
printf 'fake compat libcuda\n' > $C/compat/libcuda.so.580.95.05
ln -s libcuda.so.580.95.05 $C/compat/libcuda.so.1
ln -s libcuda.so.1 $C/compat/libcuda.so
printf 'fake stub\n' > $C/targets/x86_64-linux/lib/stubs/libcuda.so
printf 'fake cudart\n' > $C/targets/x86_64-linux/lib/libcudart.so.13.0.96
ln -s libcudart.so.13.0.96 $C/targets/x86_64-linux/lib/libcudart.so.13
printf 'fake OpenCL ICD loader\n' > $C/targets/x86_64-linux/lib/libOpenCL.so.1.0.0
ln -s libOpenCL.so.1.0.0 $C/targets/x86_64-linux/lib/libOpenCL.so.1
mkdir -p host/usr/lib/x86_64-linux-gnu host/usr/lib/i386-linux-gnu
printf 'fake ocl-icd\n' > host/usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0
ln -s libOpenCL.so.1.0.0 host/usr/lib/x86_64-linux-gnu/libOpenCL.so.1
printf 'fake i386 libcuda\n' > host/usr/lib/i386-linux-gnu/libcuda.so.$V
ln -s libcuda.so.$V host/usr/lib/i386-linux-gnu/libcuda.so.1
for b in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
	printf '#!/bin/sh\necho fake %s\n' "$b" > host/usr/bin/$b; chmod 0755 host/usr/bin/$b
done
mkdir -p host/proc/driver/nvidia/capabilities/mig
printf 'DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n' > host/proc/driver/nvidia/capabilities/mig/config
printf 'DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n' > host/proc/driver/nvidia/capabilities/mig/monitor
# The guest kernel's module tree (made for the tests, dependencies as in a
# distribution kernel with NVIDIA's DKMS modules): the GPU's modules and
# nouveau, whose aliases both match an NVIDIA 3D controller, and the RDMA
# stack of a ConnectX function (mlx5_ib binds mlx5_core's auxiliary
# device, so no PCI modalias brings it).
M=host/usr/lib/modules/$(sed -n 1p version.txt)
mkdir -p $M
while read -r p deps; do
	mkdir -p "$M/$(dirname "$p")"
	printf '\177ELF fixture module %s\n' "$(basename "$p" .ko)" > "$M/$p"
	echo "$p:${deps:+ $deps}" >> $M/modules.dep
done <<'DEP'
updates/dkms/nvidia.ko
updates/dkms/nvidia-uvm.ko updates/dkms/nvidia.ko
updates/dkms/nvidia-modeset.ko updates/dkms/nvidia.ko
updates/dkms/nvidia-peermem.ko kernel/drivers/infiniband/core/ib_core.ko updates/dkms/nvidia.ko
kernel/drivers/gpu/drm/nouveau/nouveau.ko kernel/drivers/gpu/drm/drm_kms_helper.ko kernel/drivers/gpu/drm/drm.ko
kernel/drivers/gpu/drm/drm_kms_helper.ko kernel/drivers/gpu/drm/drm.ko
kernel/drivers/gpu/drm/drm.ko
kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko kernel/drivers/net/ethernet/mellanox/mlxfw/mlxfw.ko
kernel/drivers/net/ethernet/mellanox/mlxfw/mlxfw.ko
kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko kernel/drivers/infiniband/core/ib_uverbs.ko kernel/drivers/infiniband/core/ib_core.ko kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko kernel/drivers/net/ethernet/mellanox/mlxfw/mlxfw.ko
kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/ib_uverbs.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/ib_umad.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/rdma_ucm.ko kernel/drivers/infiniband/core/rdma_cm.ko kernel/drivers/infiniband/core/ib_uverbs.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/rdma_cm.ko kernel/drivers/infiniband/core/iw_cm.ko kernel/drivers/infiniband/core/ib_cm.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/iw_cm.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/core/ib_cm.ko kernel/drivers/infiniband/core/ib_core.ko
kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko kernel/drivers/infiniband/core/ib_uverbs.ko kernel/drivers/infiniband/core/ib_core.ko
DEP
cat > $M/modules.alias <<'ALIAS'
alias pci:v000010DEd*sv*sd*bc03sc00i00* nvidia
alias pci:v000010DEd*sv*sd*bc03sc02i00* nvidia
alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau
alias pci:v000012D2d*sv*sd*bc03sc*i* nouveau
alias pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_core
alias pci:v000015B3d00001021sv*sd*bc*sc*i* mlx5_core
alias auxiliary:mlx5_core.rdma mlx5_ib
alias rdma-link-rxe rdma_rxe
ALIAS
: > $M/modules.builtin
mkdir -p host/proc/sys/kernel
sed -n 1p version.txt > host/proc/sys/kernel/osrelease
printf '%s\n' \
	'#define M(n, s) __attribute__((section(".modinfo"), used, aligned(1))) static const char n[] = s;' \
	"M(v, \"version=$V\") M(l, \"license=Dual MIT/GPL\")" \
	"M(f1, \"firmware=nvidia/$V/gsp_tu10x.bin\") M(f2, \"firmware=nvidia/$V/gsp_ga10x.bin\")" \
	'M(a1, "alias=pci:v000010DEd*sv*sd*bc03sc00i00*") M(a2, "alias=pci:v000010DEd*sv*sd*bc03sc02i00*")' \
	'M(d, "depends=") M(n, "name=nvidia")' |
	gcc -c -x c -o $M/updates/dkms/nvidia.ko -
F=host/usr/local/nvidia/firmware
mkdir -p $F/nvidia/$V host/sys/module/firmware_class/parameters
echo /usr/local/nvidia/firmware > host/sys/module/firmware_class/parameters/path
for f in gsp_ga10x gsp_tu10x; do printf 'fake GSP firmware %s\n' $f > $F/nvidia/$V/$f.bin; done
