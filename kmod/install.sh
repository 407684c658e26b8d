#!/bin/sh
# Build and load the gpushare kernel module on this node (DaemonSet
# initContainer). Idempotent: when the loaded module already has this
# source's MODULE_VERSION nothing changes; another version is unloaded first.
#
#   install.sh [--ko FILE] [--kdir DIR] [--src DIR] [--build-only OUTDIR]
#              [PARAM=VALUE ...]
#
#   --ko FILE          load this prebuilt module instead of building
#   --kdir DIR         kernel headers (default /lib/modules/$(uname -r)/build)
#   --src DIR          module source (default: this script's folder)
#   --build-only DIR   build into DIR, print the .ko path, load nothing
#   PARAM=VALUE        module parameters (nl_unit, timeout_ms, max_hold_ms, max_entries,
#                      watch_types, watch_majors)
#
# Exit status: 0 loaded (or already loaded), 2 kernel headers missing,
# 3 build failed, 4 unload failed (module in use), 5 load failed,
# 6 loaded module does not report the expected version, 64 bad usage.
set -eu

name=gpushare
src=$(cd "$(dirname "$0")" && pwd)
kdir=
ko=
build_only=
params=

die() { code=$1; shift; echo "install.sh: error: $*" >&2; exit "$code"; }
log() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
	case "$1" in
	--ko) ko=${2:?--ko needs a file}; shift 2 ;;
	--kdir) kdir=${2:?--kdir needs a folder}; shift 2 ;;
	--src) src=${2:?--src needs a folder}; shift 2 ;;
	--build-only) build_only=${2:?--build-only needs a folder}; shift 2 ;;
	*=*) params="$params $1"; shift ;;
	*) die 64 "unknown argument '$1'" ;;
	esac
done
kver=$(uname -r)
kdir=${kdir:-/lib/modules/$kver/build}

source_version() {
	sed -n 's/^#define GPUSHARE_MODULE_VERSION "\(.*\)"$/\1/p' "$src/gpushare_internal.h"
}

# The version= string of the module's .modinfo section (no modinfo needed).
ko_version() {
	tr '\0' '\n' < "$1" | sed -n 's/^version=//p' | head -n 1
}

build() {
	out=$1
	[ -f "$kdir/Makefile" ] || die 2 "kernel headers for $kver not found at $kdir; install linux-headers-$kver (Debian/Ubuntu) or kernel-devel-$kver (RHEL family), or mount the host's /lib/modules and /usr/src into this container"
	mkdir -p "$out"
	cp "$src"/Kbuild "$src"/*.c "$src"/*.h "$out"/
	mkdir -p "$out/include" && cp "$src"/include/*.h "$out/include/"
	log "building $name $(source_version) against $kdir"
	make -s -C "$kdir" M="$out" modules >&2 || die 3 "build against $kdir failed"
	[ -f "$out/$name.ko" ] || die 3 "build produced no $name.ko"
}

if [ -n "$build_only" ]; then
	build "$build_only"
	echo "$build_only/$name.ko"
	exit 0
fi

if [ -z "$ko" ]; then
	want=$(source_version)
	loaded=$(cat "/sys/module/$name/version" 2>/dev/null || true)
	if [ -n "$want" ] && [ "$loaded" = "$want" ]; then
		log "$name $want already loaded"
		exit 0
	fi
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	build "$work"
	ko=$work/$name.ko
fi
[ -f "$ko" ] || die 5 "no module file $ko"
want=$(ko_version "$ko")
[ -n "$want" ] || die 5 "$ko has no MODULE_VERSION"
loaded=$(cat "/sys/module/$name/version" 2>/dev/null || true)
if [ "$loaded" = "$want" ]; then
	log "$name $want already loaded"
	exit 0
fi
if [ -d "/sys/module/$name" ]; then
	log "unloading $name ${loaded:-(no version)}"
	rmmod "$name" || die 4 "cannot unload $name ${loaded}: in use (stop the processes that hold its netlink sockets, e.g. kmod-bridge)"
fi
log "loading $name $want${params:+ with$params}"
# shellcheck disable=SC2086
insmod "$ko" $params || die 5 "insmod $ko failed (see dmesg)"
got=$(cat "/sys/module/$name/version" 2>/dev/null || true)
[ "$got" = "$want" ] || die 6 "loaded $name reports version '$got', expected '$want'"
log "$name $want loaded"
