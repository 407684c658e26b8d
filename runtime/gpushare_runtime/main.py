"""gpushare-runtime: runc's command line; create and run get the annotated devices first.

Every command other than ``create`` and ``run`` execs the lower runtime with
exactly the same arguments.  For ``create``/``run`` the bundle's config.json
is read; if it carries gpushare annotations for this container they are
applied, the spec is written back atomically and what was done goes to the
runtime log; then the lower runtime is exec'd.  Any failure stops the create:
the lower runtime is not run and the exit status is 1.
"""

from __future__ import annotations

import sys

from . import posixfs
from .cli import Invocation, parse_invocation
from .config import RuntimeConfig, load_config
from .errors import RuntimeFailure
from .runtimelog import RuntimeLog

MARKER = b"gpushare.k8s.io/container-devices-"
# JSON may spell any character of a key as \uXXXX and its "/" as \/: a spec with neither
# these nor the literal marker holds no gpushare annotation (the launcher checks the same)
ESCAPES = (b"\\u", b"\\/")
EXIT_FAILURE = 1
EXIT_NO_LOWER = 127


def prepare_bundle(invocation: Invocation, config: RuntimeConfig, log: RuntimeLog) -> None:
    """Apply this container's annotations to its bundle, if it has any."""
    from .bundle import parse_spec, read_raw, write_spec

    bundle = invocation.bundle or posixfs.getcwd()
    raw = read_raw(bundle)
    if MARKER not in raw and not any(escape in raw for escape in ESCAPES):
        return
    from .edits import apply_edits
    from .inject import Injector

    spec = parse_spec(bundle, raw)
    injector = Injector(config, bundle, spec)
    edits = injector.edits()
    if not edits:
        return
    updated = apply_edits(spec, edits)
    if updated != spec:
        write_spec(bundle, updated)
    for action in injector.actions:
        log.info(f"gpushare: {action}")


def exec_lower(lower: str, args: list[str], log: RuntimeLog) -> int:
    try:
        posixfs.execvp(lower, [lower, *args])
    except OSError as err:
        log.error(f"cannot run the lower runtime {lower!r}: {err.strerror}")
    return EXIT_NO_LOWER


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    invocation = parse_invocation(args)
    log = RuntimeLog(invocation.log_path, invocation.log_format)
    try:
        config = load_config()
        if invocation.edits_spec:
            prepare_bundle(invocation, config, log)
    except RuntimeFailure as err:
        container = f" {invocation.container_id}" if invocation.container_id else ""
        log.error(f"{invocation.command}{container}: {err}")
        return EXIT_FAILURE
    return exec_lower(config.lower_runtime, args, log)
