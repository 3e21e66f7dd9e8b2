#!/usr/bin/env bash
# Extracts the guest kernel for the qemu engine from Debian's cloud kernel
# package into $1 (default /var/cache/clade/qemu): an uncompressed vmlinux
# (QEMU's microvm boots it through PVH, skipping decompression, which is slow
# under TCG) and the few modules a clade guest loads (virtio over MMIO, its
# block, serial and network devices, overlayfs). The package is downloaded, never
# installed on the host.
set -euo pipefail
out=${1:-/var/cache/clade/qemu}
mods="kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_mmio.ko
kernel/drivers/block/virtio_blk.ko kernel/drivers/char/virtio_console.ko kernel/fs/overlayfs/overlay.ko
kernel/drivers/char/hw_random/virtio-rng.ko kernel/net/core/failover.ko kernel/drivers/net/net_failover.ko
kernel/drivers/net/virtio_net.ko"
if [ -s "$out/vmlinux" ] && [ -s "$out/modules/virtio_net.ko" ]; then exit 0; fi
command -v lz4 >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lz4)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
[ -n "$pkg" ] || { echo "no linux-image-cloud-amd64 in apt: run apt-get update" >&2; exit 1; }
apt-get download "$pkg" 2>&1 | grep -v unsandboxed || true
dpkg-deb -x ./*.deb x
vmlinuz=$(ls x/boot/vmlinuz-*)
# The bzImage carries an LZ4 payload (CONFIG_KERNEL_LZ4): find its magic and decompress.
off=$(grep -abo $'\x02!L\x18' "$vmlinuz" | head -1 | cut -d: -f1)
mkdir -p "$out/modules.tmp"
tail -c +$((off + 1)) "$vmlinuz" | lz4 -dc > "$out/vmlinux.tmp" 2>/dev/null || true
head -c 4 "$out/vmlinux.tmp" | grep -q ELF || { echo "could not extract vmlinux from $vmlinuz" >&2; exit 1; }
kdir=$(ls -d x/lib/modules/*)
for m in $mods; do cp "$kdir/$m" "$out/modules.tmp/"; done
basename "$kdir" > "$out/modules.tmp/version"
rm -rf "$out/modules"
mv "$out/modules.tmp" "$out/modules"
mv "$out/vmlinux.tmp" "$out/vmlinux"
echo "guest kernel $(cat "$out/modules/version") in $out"
