#!/bin/sh
# Prepare a node for gpushare (run by the gpushare-node-installer DaemonSet, or by hand as root):
#   k8s/node-install.sh HOST_ROOT        (HOST_ROOT=/ when run on the node itself)
# - copies gpushare-runtime (standard-library Python) to HOST_ROOT/opt/gpushare/runtime and
#   writes the launcher HOST_ROOT/usr/local/bin/gpushare-runtime (needs python3 >= 3.11 on the node);
#   with it grpcio and protobuf for the node's python version (SITE/<X.Y>, prepared in the
#   installer image), which a create that copies from another pod imports to ask the kubelet;
# - writes /etc/gpushare/runtime.json and the containerd drop-in /etc/containerd/conf.d/gpushare.toml
#   (from /etc/gpushare-config when mounted, else the repository's defaults), with this node's
#   name (GPUSHARE_NODE_NAME, else the host name) as "node_name";
# - creates the node signing key /etc/gpushare/signing.key (0600, root) when missing;
# - restarts containerd only when GPUSHARE_RESTART_CONTAINERD=true.
# Idempotent: running it twice changes nothing the second time.
set -eu
host=${1:?usage: node-install.sh HOST_ROOT}
src=$(cd "$(dirname "$0")/.." && pwd)
config=${GPUSHARE_CONFIG_DIR:-/etc/gpushare-config}
step() { echo "gpushare-node-install: $*"; }
fail() { echo "gpushare-node-install: error: $*" >&2; exit 1; }

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
  for dir in /usr/bin /usr/local/bin; do
    p="$host$dir/$candidate"
    if [ -x "$p" ]; then python="$dir/$candidate"; break 2; fi
  done
done
[ -n "$python" ] || fail "no python3 on the node (looked in /usr/bin and /usr/local/bin): install python3 >= 3.11"
if [ "$host" = "/" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || fail "$python is older than 3.11"
fi

step "runtime -> $host/opt/gpushare/runtime (interpreter $python)"
dest="$host/opt/gpushare/runtime"
common="$src/libs/common/gpushare_common"
mkdir -p "$dest/runtime" "$dest/common/gpushare_common/adapters/kubeletapi"
cp -R "$src/runtime/gpushare_runtime" "$dest/runtime/"
cp "$common/__init__.py" "$common/ids.py" "$common/isolation.py" "$common/vendors.py" "$common/dra.py" \
   "$dest/common/gpushare_common/"
# the kubelet's pod-resources client: a copy from another pod only on the kubelet's word
cp "$common/adapters/__init__.py" "$common/adapters/podresources.py" "$dest/common/gpushare_common/adapters/"
cp "$common/adapters/kubeletapi/__init__.py" "$common/adapters/kubeletapi/podresources_v1_pb2.py" \
   "$common/adapters/kubeletapi/podresources_v1_pb2_grpc.py" "$dest/common/gpushare_common/adapters/kubeletapi/"
# grpcio and protobuf built for the node's python (python3.X, or what python3 links to)
version=$(basename "$(readlink -f "$host$python" 2>/dev/null || echo "$python")" | sed -n 's/^python\(3\.[0-9]*\)$/\1/p')
site=${GPUSHARE_RUNTIME_SITE:-$src/site}/$version
if [ -n "$version" ] && [ -d "$site" ]; then
  rm -rf "$dest/site.new" && cp -R "$site" "$dest/site.new" && rm -rf "$dest/site" && mv "$dest/site.new" "$dest/site"
else
  step "warning: no grpcio/protobuf for python ${version:-?} in ${site%/*}: creates that copy devices from another pod will fail (the kubelet cannot be asked)"
fi
mkdir -p "$host/usr/local/bin"
sed -e "s|@PYTHON@|$python|g" -e "s|@RUNTIME_DIR@|/opt/gpushare/runtime/runtime|g" \
    -e "s|@COMMON_DIR@|/opt/gpushare/runtime/common|g" -e "s|@SITE_DIRS@|\"/opt/gpushare/runtime/site\"|g" \
    "$src/runtime/install/launcher.sh.in" > "$host/usr/local/bin/gpushare-runtime.new"
chmod 0755 "$host/usr/local/bin/gpushare-runtime.new"
mv -f "$host/usr/local/bin/gpushare-runtime.new" "$host/usr/local/bin/gpushare-runtime"

step "configuration -> $host/etc/gpushare/runtime.json, containerd drop-in"
mkdir -p "$host/etc/gpushare" "$host/etc/containerd/conf.d"
chmod 0700 "$host/etc/gpushare"
runtime_json="$config/runtime.json"; [ -f "$runtime_json" ] || runtime_json="$src/runtime/install/runtime.json.example"
dropin="$config/containerd-gpushare.toml"; [ -f "$dropin" ] || dropin="$src/runtime/install/containerd-gpushare.toml"
# the runtime binds every signature to this node's name: write it into the configuration
node=${GPUSHARE_NODE_NAME:-$(hostname)}
case "$node" in *[!a-z0-9.-]*|"") fail "node name '$node' is not a DNS name: set GPUSHARE_NODE_NAME";; esac
awk -v node="$node" 'done || $0 != "{" { if ($0 !~ /"node_name"[ ]*:/) print; next }
  { print; printf "  \"node_name\": \"%s\",\n", node; done = 1 }
  END { if (!done) exit 3 }' "$runtime_json" > "$host/etc/gpushare/runtime.json.new" ||
  fail "$runtime_json must start with a line holding only '{' (node_name is inserted after it)"
mv -f "$host/etc/gpushare/runtime.json.new" "$host/etc/gpushare/runtime.json"
cp "$dropin" "$host/etc/containerd/conf.d/gpushare.toml"
if ! grep -qs 'conf.d' "$host/etc/containerd/config.toml"; then
  step "note: $host/etc/containerd/config.toml does not import conf.d; add: imports = [\"/etc/containerd/conf.d/*.toml\"]"
fi

key="$host/etc/gpushare/signing.key"
if [ ! -s "$key" ]; then
  step "creating the node signing key $key"
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$key.new" && mv "$key.new" "$key")
fi
chmod 0600 "$key"

if [ "${GPUSHARE_RESTART_CONTAINERD:-false}" = true ] && [ "$host" != "/" ]; then
  step "restarting containerd"
  chroot "$host" systemctl restart containerd || fail "could not restart containerd"
fi
step "done"
