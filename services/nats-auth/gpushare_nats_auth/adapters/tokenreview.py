"""The Kubernetes API's verdict on a service-account token (TokenReview), as a :class:`Review`."""

from __future__ import annotations

from typing import Any

from gpushare_common.adapters.kube import Kube, KubeError

from ..handlers import Review

NODE_NAME = "authentication.kubernetes.io/node-name"
POD_NAME = "authentication.kubernetes.io/pod-name"


class ReviewUnavailable(Exception):
    """The API could not be asked (the message says why); the client may try again."""


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first(extra: dict[str, Any], key: str) -> str:
    found = extra.get(key)
    return found[0] if isinstance(found, list) and found and isinstance(found[0], str) else ""


def review_of(status: dict[str, Any]) -> Review:
    """A TokenReview ``status`` as a :class:`Review` (malformed parts read as absent)."""
    user = _mapping(status.get("user"))
    extra = _mapping(user.get("extra"))
    audiences = status.get("audiences")
    return Review(authenticated=status.get("authenticated") is True, username=str(user.get("username") or ""),
                  node=_first(extra, NODE_NAME), pod=_first(extra, POD_NAME), error=str(status.get("error") or ""),
                  audiences=tuple(a for a in audiences if isinstance(a, str)) if isinstance(audiences, list) else ())


class TokenReviewer:
    def __init__(self, kube: Kube, audience: str) -> None:
        self.kube = kube
        self.audience = audience

    async def review(self, token: str) -> Review:
        try:
            status = await self.kube.review_token(token, [self.audience])
        except KubeError as err:
            raise ReviewUnavailable(str(err)) from None
        return review_of(status)

    async def close(self) -> None:
        await self.kube.close()
