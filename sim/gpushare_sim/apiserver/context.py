"""What every handler gets (the store, settings) and how it answers JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.responses import Response

from .errors import ApiError
from .store import Store

_encode = msgspec.json.Encoder().encode
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Context:
    store: Store
    bookmark_interval: float


def json_response(body: Any, code: int = 200, warnings: list[str] | None = None) -> Response:
    raw = body if isinstance(body, bytes) else _encode(body)
    headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else None
    return Response(raw, status_code=code, media_type=JSON, headers=headers)


def error_response(error: ApiError) -> Response:
    return json_response(error.status(), error.code)
