#!/bin/sh
# Install the gpushare-runtime executable.
#
#   runtime/install/install.sh [BIN_DIR] [PYTHON]
#
# BIN_DIR defaults to the repository's .venv/bin, PYTHON to .venv/bin/python.
# Writes BIN_DIR/gpushare-runtime, a small POSIX sh launcher:
#   - create/run of a bundle whose config.json may name a gpushare annotation
#     start PYTHON -I -S on the gpushare_runtime package (no site import, no
#     environment, an explicit sys.path to this checkout), which edits the
#     bundle and execs the lower runtime; a create whose config.json cannot
#     name one (an exact grep, see launcher.sh.in) goes to the lower runtime;
#   - every other command (state, start, kill, delete, ps, exec, events, ...)
#     execs the lower runtime at once: its name is read from the
#     "lower_runtime" line of the configuration file (runc when absent).
# The packages are byte-compiled so that no create pays for compiling.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bindir=${1:-$repo/.venv/bin}
python=${2:-$repo/.venv/bin/python}
target="$bindir/gpushare-runtime"

[ -x "$python" ] || { echo "error: $python is not an executable Python" >&2; exit 1; }
# the launcher runs from anywhere: keep an absolute interpreter path (not resolved:
# a virtual environment's python must stay the venv's, never a shim)
case $python in /*) ;; *) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;; esac
mkdir -p "$bindir"
common="$repo/libs/common/gpushare_common"
"$python" -I -m compileall -q "$repo/runtime/gpushare_runtime" "$common/ids.py" "$common/isolation.py" \
    "$common/__init__.py" "$common/dra.py" "$common/adapters" >/dev/null
# the interpreter's site directories, searched after the standard library: only a create that
# copies from another pod imports from them (grpc, to ask the kubelet which devices it allocated)
site=$("$python" -I -c 'import sys, sysconfig; p = sysconfig.get_paths(); found = sorted({p["purelib"], p["platlib"]})
sys.exit("a site directory holds a quote, a backslash or a |") if any(set(d) & set(chr(34) + chr(39) + chr(92) + "|") for d in found) else None
print(", ".join(chr(34) + d + chr(34) for d in found))')

tmp="$target.tmp.$$"
sed -e "s|@PYTHON@|$python|g" -e "s|@RUNTIME_DIR@|$repo/runtime|g" \
    -e "s|@COMMON_DIR@|$repo/libs/common|g" -e "s|@SITE_DIRS@|$site|g" "$here/launcher.sh.in" > "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$target"
echo "installed $target"
