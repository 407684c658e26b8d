#!/bin/sh
# Builds the base initramfs of the gpushare test VM:
#   build-initramfs.sh OUT.cpio.gz KERNEL_VERSION [MODULES_ROOT]
# busybox (static) as every tool, kmod/vm/init as /init, and the virtio and
# 9p modules of KERNEL_VERSION (from MODULES_ROOT, default /lib/modules) so
# the guest can mount the host's root over 9p. Extra files (the module under
# test, a guest script) are appended later as a second cpio archive.
set -eu
out=$1
kver=$2
modroot=${3:-/lib/modules}/$kver
here=$(cd "$(dirname "$0")" && pwd)
mods="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p"

busybox=$(command -v busybox) || { echo "error: busybox not found (install busybox-static)" >&2; exit 1; }
if command -v file >/dev/null && file -L "$busybox" | grep -q "dynamically linked"; then
	echo "error: $busybox is not static (install busybox-static)" >&2
	exit 1
fi
[ -f "$modroot/modules.dep" ] || { echo "error: no modules for kernel $kver in $modroot" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/sbin" "$stage/proc" "$stage/sys" "$stage/dev" \
	"$stage/tmp" "$stage/etc" "$stage/lib/vm-modules" "$stage/root"
cp "$busybox" "$stage/bin/busybox"
cp "$here/init" "$stage/init"
chmod 755 "$stage/init"
: > "$stage/lib/vm-modules/order"
for m in $mods; do
	rel=$(grep -E "(^|/)$m\.ko(\.xz|\.zst|\.gz)?:" "$modroot/modules.dep" | head -n 1 | cut -d: -f1)
	if [ -z "$rel" ]; then
		echo "note: $m is not a module of $kver (built in?)" >&2
		continue
	fi
	case "$rel" in
	*.ko) cp "$modroot/$rel" "$stage/lib/vm-modules/$m.ko" ;;
	*.ko.xz) xz -dc "$modroot/$rel" > "$stage/lib/vm-modules/$m.ko" ;;
	*.ko.zst) zstd -qdc "$modroot/$rel" > "$stage/lib/vm-modules/$m.ko" ;;
	*.ko.gz) gzip -dc "$modroot/$rel" > "$stage/lib/vm-modules/$m.ko" ;;
	esac
	echo "$m" >> "$stage/lib/vm-modules/order"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$stage/etc/passwd"
echo "nobody:x:65534:65534:nobody:/:/bin/false" >> "$stage/etc/passwd"
echo "root:x:0:" > "$stage/etc/group"
(cd "$stage" && find . | sort | cpio -o -H newc --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
