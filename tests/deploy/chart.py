"""The Helm chart ``k8s/chart/gpushare``, rendered with a real ``helm template``.

The chart is the one source of the manifests: ``k8s/base`` (kustomize) is the chart rendered
with ``k8s/chart/base-values.yaml``, one file per template, and the kernel-module component's
patch is the kmod-bridge DaemonSet rendered with the module on. ``make manifests`` runs
``python -m tests.deploy.chart --write``; ``tests/deploy/test_chart.py`` checks the committed
files are what the chart renders.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import tools

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CHART = K8S / "chart" / "gpushare"
BASE = K8S / "base"
BASE_VALUES = K8S / "chart" / "base-values.yaml"
KMOD_PATCH = K8S / "components" / "kmod" / "kmod-bridge.yaml"
RELEASE, NAMESPACE = "gpushare", "gpushare-system"
HANDWRITTEN = ("kustomization.yaml",)  # in k8s/base, beside the rendered files (and nats.conf)
HEADER = ("# Rendered from k8s/chart/gpushare by `make manifests` (helm template with "
          "k8s/chart/base-values.yaml{extra}): edit the chart, not this file.\n")


class RenderError(RuntimeError):
    pass


def _helm(args: list[str], values: dict[str, Any], value_files: list[Path]) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as overrides:
        json.dump(values, overrides)
        overrides.flush()
        files = [a for f in (*value_files, Path(overrides.name)) for a in ("--values", str(f))]
        command = [str(tools.binary("helm")), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                   *files, *args]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RenderError(f"helm template with {values}: {result.stderr.strip()}")
    return result.stdout


def notes(values: dict[str, Any] | None = None) -> str:
    """The chart's NOTES.txt as ``helm install`` prints it for ``values`` (a client-side dry run:
    no cluster is asked)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as overrides:
        json.dump(values or {}, overrides)
        overrides.flush()
        command = [str(tools.binary("helm")), "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                   "--dry-run=client", "--values", overrides.name]
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                env={"PATH": os.environ.get("PATH", ""), "KUBECONFIG": os.devnull,
                                     "HOME": tempfile.gettempdir()})  # fmt: skip
    if result.returncode != 0:
        raise RenderError(f"helm install --dry-run with {values}: {result.stderr.strip()}")
    return result.stdout.split("\nNOTES:\n", 1)[1]


def render(values: dict[str, Any] | None = None, base: bool = False) -> list[dict[str, Any]]:
    """Every object the chart renders with ``values`` over its defaults (over the base's with ``base``)."""
    text = _helm([], values or {}, [BASE_VALUES] if base else [])
    return [d for d in yaml.safe_load_all(text) if d]


def render_files(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template file name -> its rendering, for the base's values plus ``values``."""
    with tempfile.TemporaryDirectory() as out:
        _helm(["--output-dir", out], values or {}, [BASE_VALUES])
        rendered = Path(out) / "gpushare" / "templates"
        return {p.name: p.read_text() for p in sorted(rendered.glob("*.yaml"))}


def _with_header(text: str, extra: str = "") -> str:
    return HEADER.format(extra=extra) + text


def expected_files() -> dict[Path, str]:
    """Every generated file (path -> content) as the chart renders it now."""
    files = {BASE / name: _with_header(text) for name, text in render_files().items()}
    kmod = render_files({"kernelModule": {"enabled": True}})["kmod-bridge.yaml"]
    files[KMOD_PATCH] = _with_header(kmod, extra=", kernelModule.enabled=true")
    return files


def generated_in_base() -> set[Path]:
    return {p for p in BASE.glob("*.yaml") if p.name not in HANDWRITTEN}


def write() -> list[Path]:
    """Write the generated files; remove rendered files of templates that are gone."""
    expected = expected_files()
    for stale in generated_in_base() - expected.keys():
        stale.unlink()
    changed = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    for path in changed:
        path.write_text(expected[path])
    return changed


def differences() -> list[str]:
    """What differs between the committed generated files and a fresh rendering."""
    expected = expected_files()
    found = [f"{p.relative_to(ROOT)}: not rendered by the chart" for p in generated_in_base() - expected.keys()]
    for path, text in sorted(expected.items()):
        if not path.is_file():
            found.append(f"{path.relative_to(ROOT)}: missing")
        elif path.read_text() != text:
            found.append(f"{path.relative_to(ROOT)}: differs from the chart's rendering")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write k8s/base and the kmod component")
    args = parser.parse_args()
    if args.write:
        for path in write():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    problems = differences()
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("run `make manifests`", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
