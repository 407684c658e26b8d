"""Reading the product's source for the second ways of doing one thing (``make lint`` runs these).

Each check walks the syntax trees of the product's modules (the shared library, the services,
the runtime, the sim, the benches) and returns one line per finding: ``path:line: what``.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("libs/common/gpushare_common", "services", "runtime/gpushare_runtime", "sim/gpushare_sim", "bench")
SUBJECTS = "libs/common/gpushare_common/subjects.py"
QUANTITY = "libs/common/gpushare_common/quantity.py"
NATS_PREFIXES = ("$JS.", "$KV.", "$SYS.", "_INBOX")
SI_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


@dataclass(frozen=True, slots=True)
class Module:
    path: str  # relative to the repository
    tree: ast.Module
    docstrings: frozenset[int]  # ids of the constant nodes that are docstrings
    lines: tuple[str, ...]


@functools.cache
def modules() -> tuple[Module, ...]:
    found = []
    for root in PRODUCT:
        for file in sorted((ROOT / root).rglob("*.py")):
            if "_pb2" in file.name or ".venv" in file.parts:
                continue
            text = file.read_text(encoding="utf-8")
            tree = ast.parse(text, str(file))
            found.append(Module(str(file.relative_to(ROOT)), tree, frozenset(_docstrings(tree)),
                                tuple(text.splitlines())))
    return tuple(found)


def _docstrings(tree: ast.Module) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield id(first.value)


def _names_prefix(node: ast.AST) -> bool:
    """An expression that is a subject prefix: ``prefix``, ``x.prefix``."""
    return (isinstance(node, ast.Name) and node.id == "prefix") or \
        (isinstance(node, ast.Attribute) and node.attr == "prefix")


def _starts_with_dot(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(".")
    return isinstance(node, ast.JoinedStr) and bool(node.values) and _starts_with_dot(node.values[0])


def _subject_built(node: ast.AST) -> str:
    """Why ``node`` builds a NATS subject ("" when it does not)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if "gpushare.v1" in node.value:
            return "writes the subject prefix gpushare.v1"
        if node.value.startswith(NATS_PREFIXES):
            return f"writes a NATS subject ({node.value[:24]!r})"
    if isinstance(node, ast.JoinedStr):
        parts = node.values
        for before, after in itertools.pairwise(parts):
            if isinstance(before, ast.FormattedValue) and _names_prefix(before.value) and _starts_with_dot(after):
                return "builds a subject from a prefix"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _names_prefix(node.left) and \
            _starts_with_dot(node.right):
        return "builds a subject from a prefix"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace" and \
            [getattr(a, "value", None) for a in node.args] == [".", "_"]:
        return "re-implements subjects.node_token"
    return ""


def subject_building() -> list[str]:
    """Subjects are built in ``subjects.py`` only (docs/architecture.md)."""
    found = []
    for module in modules():
        if module.path == SUBJECTS:
            continue
        for node in ast.walk(module.tree):
            why = "" if id(node) in module.docstrings else _subject_built(node)
            if why:
                found.append(f"{module.path}:{getattr(node, 'lineno', 0)}: {why}; use gpushare_common.subjects")
    return found


def _quantity_suffix(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    return node.value in SI_SUFFIXES or any(f"{s}|" in node.value or f"|{s}" in node.value for s in SI_SUFFIXES)


def quantity_parsing() -> list[str]:
    """Kubernetes quantities are read by ``quantity.py`` only (docs/pods.md)."""
    return [f"{m.path}:{node.lineno}: a quantity suffix table; use gpushare_common.quantity"
            for m in modules() if m.path != QUANTITY
            for node in ast.walk(m.tree) if _quantity_suffix(node) and id(node) not in m.docstrings]


def cel_evaluation() -> list[str]:
    """The sim evaluates DRA selectors with cel-python, not with a parser of its own."""
    found = []
    for module in modules():
        if not module.path.startswith("sim/gpushare_sim/dra/"):
            continue
        imports = {a.name.split(".")[0] for n in ast.walk(module.tree) if isinstance(n, ast.Import) for a in n.names}
        imports |= {(n.module or "").split(".")[0] for n in ast.walk(module.tree) if isinstance(n, ast.ImportFrom)}
        if module.path.endswith("/cel.py") and "celpy" not in imports:
            found.append(f"{module.path}:1: DRA selectors must be evaluated by celpy")
        found += [f"{module.path}:{n.lineno}: {n.name}: a hand-written expression parser; use celpy"
                  for n in ast.walk(module.tree)
                  if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name.lower().strip("_") in
                  ("parser", "tokens", "tokenize", "lexer")]  # fmt: skip
    return found


def _broad(kind: ast.expr | None) -> bool:
    """``except:``, ``except Exception``, ``except (X, BaseException)``."""
    names = kind.elts if isinstance(kind, ast.Tuple) else [kind]
    return any(n is None or (isinstance(n, ast.Name) and n.id in ("Exception", "BaseException")) for n in names)


def _suppresses_everything(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "suppress" \
        and any(_broad(arg) for arg in node.args)


def broad_catches() -> list[str]:
    """A catch of everything only at a boundary (a gRPC servicer, a callback, a cleanup), saying
    why in a comment on its line, or re-raising; in the bus, only where a handler is called."""
    found = []
    for module in modules():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ExceptHandler) and _broad(node.type):
                if node.body and isinstance(node.body[-1], ast.Raise) and node.body[-1].exc is None:
                    continue  # cleans up and re-raises: nothing is caught
            elif not _suppresses_everything(node):
                continue
            line = module.lines[node.lineno - 1]
            comment = line.split("#", 1)[1] if "#" in line else ""
            if not comment.strip():
                found.append(f"{module.path}:{node.lineno}: a catch of everything without a comment saying why")
            elif module.path.startswith("libs/common/gpushare_common/bus/") and "boundary" not in comment:
                found.append(f"{module.path}:{node.lineno}: the bus catches nats-py's and msgspec's errors "
                             "(errors.FAILURES), everything only where it calls a handler")
    return found


RETRY = "libs/common/gpushare_common/retry.py"


def _hand_backoff(node: ast.AST) -> str:
    """Why ``node`` is a backoff of its own ("" when it is not)."""
    if isinstance(node, ast.keyword) and node.arg == "jitter" and isinstance(node.value, ast.Constant) and \
            not node.value.value:
        return "a backoff without jitter (nodes would retry in step)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("next", "reset") \
            and "backoff" in ast.unparse(node.func.value).lower():
        return f"a loop driving a backoff by hand (.{node.func.attr}())"
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) and isinstance(node.target, ast.Name) and \
            any(word in node.target.id.lower() for word in ("delay", "backoff", "wait")):
        return "a delay doubled by hand"
    return ""


def backoff_loops() -> list[str]:
    """Retrying loops are ``retry.Supervised`` (or ``retry.retry``): jitter on, stop-aware."""
    return [f"{m.path}:{getattr(node, 'lineno', 0) or getattr(node.value, 'lineno', 0)}: {why}; use "
            "gpushare_common.retry.Supervised"
            for m in modules() if m.path != RETRY
            for node in ast.walk(m.tree) if (why := _hand_backoff(node))]


CHECKS: dict[str, Callable[[], list[str]]] = {
    "subjects": subject_building,
    "quantities": quantity_parsing,
    "cel": cel_evaluation,
    "broad-catches": broad_catches,
    "backoff-loops": backoff_loops,
}


def main() -> int:
    failures = [line for check in CHECKS.values() for line in check()]
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
