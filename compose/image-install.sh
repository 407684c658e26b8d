#!/usr/bin/env bash
# Install one gpushare service (or the runtime) into a fresh virtual environment.
# This is the install step of every image (see services/*/Dockerfile); CI runs the
# same script into temporary directories so what the images install is tested.
#
#   compose/image-install.sh SERVICE PREFIX
#   SERVICE: detector | solver | deviceplugin | kmod-bridge | shadow-controller | nats-auth | console | dra-driver | sim
#   PREFIX:  directory of the new virtual environment (e.g. /opt/gpushare)
#   UV:      path of a uv binary to install with (faster; CI uses it: no pip in the environments); default: pip
set -euo pipefail

service=${1:?usage: image-install.sh SERVICE PREFIX}
prefix=${2:?usage: image-install.sh SERVICE PREFIX}
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

case "$service" in
  detector|solver|deviceplugin|kmod-bridge|shadow-controller|nats-auth|console|dra-driver) pkg="$src/services/$service" ;;
  sim) pkg="$src/sim" ;;
  *) echo "image-install.sh: unknown service '$service' (detector, solver, deviceplugin, kmod-bridge, shadow-controller, nats-auth, console, dra-driver, sim)" >&2; exit 2 ;;
esac

echo "==> [1/4] virtual environment in $prefix"
# with uv, which installs into an environment from outside it, the environments need no pip of their own
venv() { "$python" -m venv ${UV:+--without-pip} "$1"; }
venv "$prefix"
install() { # target-python packages...
  local target=$1; shift
  if [ -n "${UV:-}" ]; then "$UV" pip install --quiet --no-sources --python "$target" "$@"
  else "$target" -m pip install --quiet --disable-pip-version-check "$@"; fi
}

echo "==> [2/4] generating gRPC stubs from libs/common/proto"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/libs/common" "$work/common"
venv "$work/tools"
install "$work/tools/bin/python" 'grpcio-tools>=1.66'
out="$work/common/gpushare_common/adapters/kubeletapi"
mkdir -p "$out"
"$work/tools/bin/python" -m grpc_tools.protoc -I"$work/common/proto" --python_out="$out" \
  --grpc_python_out="$out" "$work"/common/proto/*.proto
sed -i -E 's/^import (\w+_pb2)/from . import \1/' "$out"/*_pb2*.py

echo "==> [3/4] installing gpushare-common and $service"
install "$prefix/bin/python" "$work/common" "$pkg"

echo "==> [4/4] checking the entry point"
"$prefix/bin/python" - "$service" <<'PY'
import importlib, sys
name = sys.argv[1].replace("-", "_")
module = "gpushare_sim" if name == "sim" else f"gpushare_{name}"
importlib.import_module(module)
importlib.import_module("gpushare_common.adapters.kubeletapi.deviceplugin_v1beta1_pb2_grpc")
print(f"ok: {module} importable from {sys.prefix}")
PY
