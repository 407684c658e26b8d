"""The end-to-end cluster fixture of tests/e2e, shared here (one local cluster per module)."""

from tests.e2e.conftest import cluster_children, e2e  # noqa: F401  (fixtures)
