"""Entry point: read settings once, set up logs, run the service until a signal."""

from __future__ import annotations

import asyncio
import sys

from gpushare_common import ids
from gpushare_common import logging as gs_logging
from gpushare_common.settings import SettingsError, load_common
from gpushare_common.tasks import run_service

from . import app
from .settings import load_settings

DEFAULT_PORT = 8083


def main() -> int:
    try:
        common = load_common(default_port=DEFAULT_PORT)
        settings = load_settings()
        common.node.require()
        key = ids.load_key(settings.signing_key_file)
    except (SettingsError, ids.IdError) as err:
        print(f"gpushare-deviceplugin: {err}", file=sys.stderr)
        return 2
    gs_logging.setup(common.log.level, common.log.json)

    async def service(stop: asyncio.Event) -> int:
        return await app.run(common, settings, key, stop)

    return run_service(app.SERVICE, service)


if __name__ == "__main__":
    sys.exit(main())
