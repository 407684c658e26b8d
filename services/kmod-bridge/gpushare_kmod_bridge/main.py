"""Entry point: read settings once, set up logs, run the bridge until a signal."""

from __future__ import annotations

import asyncio
import sys

from gpushare_common import logging as gs_logging
from gpushare_common.settings import SettingsError, load_common
from gpushare_common.tasks import run_service

from . import app
from .settings import load_settings

DEFAULT_PORT = 8085


def main() -> int:
    try:
        common = load_common(default_port=DEFAULT_PORT)
        settings = load_settings()
        common.node.require()
    except SettingsError as err:
        print(f"gpushare-kmod-bridge: {err}", file=sys.stderr)
        return 2
    gs_logging.setup(common.log.level, common.log.json)

    async def service(stop: asyncio.Event) -> int:
        return await app.run(common, settings, stop)

    return run_service(app.SERVICE, service)


if __name__ == "__main__":
    sys.exit(main())
