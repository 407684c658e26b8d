"""Entry point: read settings once, set up logs, run the console until a signal."""

from __future__ import annotations

import sys

from gpushare_common import logging as gs_logging
from gpushare_common.settings import load, load_common
from gpushare_common.tasks import ServiceMain, service_main

from . import app
from .settings import PREFIX, ConsoleSettings

DEFAULT_PORT = 8080


def main() -> int:
    def build() -> ServiceMain:
        common = load_common(default_port=DEFAULT_PORT)
        settings = load(ConsoleSettings, PREFIX).check()
        gs_logging.setup(common.log.level, common.log.json)
        return lambda stop: app.run(common, settings, stop)

    return service_main(app.SERVICE, build)


if __name__ == "__main__":
    sys.exit(main())
