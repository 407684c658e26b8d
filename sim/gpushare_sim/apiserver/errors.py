"""API errors, answered as Kubernetes `Status` objects (never a bare 500)."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """A request the emulator refuses; `status()` is the body it answers with."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def success(code: int = 200, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def _about(code: int, text: str, plural: str, name: str, group: str, reason: str | None) -> ApiError:
    """An error about one named object; `text` may use {resource} and {name}."""
    resource = f"{plural}.{group}" if group else plural
    return ApiError(
        code,
        text.format(resource=resource, name=f'"{name}"'),
        reason=reason,
        details={"name": name, "group": group, "kind": plural},
    )


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    return _about(404, "{resource} {name} not found", plural, name, group, None)


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    return _about(409, "{resource} {name} already exists", plural, name, group, "AlreadyExists")


def conflict(plural: str, name: str, why: str, group: str = "") -> ApiError:
    text = "Operation cannot be fulfilled on {resource} {name}: " + why.replace("{", "{{").replace("}", "}}")
    return _about(409, text, plural, name, group, None)


def stale(plural: str, name: str, group: str = "") -> ApiError:
    return conflict(
        plural,
        name,
        "the object has been modified; please apply your changes to the latest "
        "version and try again",
        group,
    )


def gone(resource_version: int, oldest: int) -> ApiError:
    return ApiError(
        410,
        f"too old resource version: {resource_version} ({oldest})",
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 with one cause per (field, message)."""
    text = "; ".join(f"{field}: {message}" for field, message in causes)
    return ApiError(
        422,
        f'{kind} "{name}" is invalid: {text}',
        details={
            "name": name,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": message, "field": field}
                for field, message in causes
            ],
        },
    )
