"""The runtime's error tree: every failure says what was wrong and where it came from."""

from __future__ import annotations


class RuntimeFailure(Exception):
    """A create that must not go ahead; the message goes to stderr and the runtime log."""


class ConfigError(RuntimeFailure):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"runtime configuration {path}: {reason}")


class BundleError(RuntimeFailure):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"bundle {path}: {reason}")


class AnnotationError(RuntimeFailure):
    """A gpushare annotation that cannot be honoured: which annotation, which source, why."""

    def __init__(self, annotation: str, source: str, reason: str) -> None:
        self.annotation = annotation
        self.source = source
        self.reason = reason
        where = f"annotation {annotation}" + (f", source {source}" if source else "")
        super().__init__(f"{where}: {reason}")


class CdiError(RuntimeFailure):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"CDI spec {path}: {reason}")
