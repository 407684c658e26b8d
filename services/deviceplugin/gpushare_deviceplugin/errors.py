"""Typed errors of the device plugins; the gRPC adapter maps ``code`` to a status code."""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal["invalid-argument", "not-found", "failed-precondition", "unavailable"]


class PluginError(Exception):
    """A refused request: what was wrong, for which resource, and why."""

    def __init__(self, code: ErrorCode, resource: str, message: str) -> None:
        self.code: ErrorCode = code
        self.resource = resource
        self.message = message
        super().__init__(f"{resource}: {message}")


def invalid(resource: str, message: str) -> PluginError:
    return PluginError("invalid-argument", resource, message)


def not_found(resource: str, message: str) -> PluginError:
    return PluginError("not-found", resource, message)


def refused(resource: str, message: str) -> PluginError:
    return PluginError("failed-precondition", resource, message)
