"""``gpushare-detector``: parse settings once, set up logging, run the service."""

from __future__ import annotations

import asyncio

from gpushare_common import logging as gslog
from gpushare_common.tasks import run_service

from .app import SERVICE, run
from .settings import load_settings


def main() -> int:
    settings = load_settings()
    gslog.setup(settings.common.log.level, settings.common.log.json)

    async def service(stop: asyncio.Event) -> int:
        return await run(settings, stop)

    return run_service(SERVICE, service)
