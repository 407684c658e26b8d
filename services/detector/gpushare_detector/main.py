"""``gpushare-detector``: parse settings once, set up logging, run the service."""

from __future__ import annotations

import sys

from gpushare_common.tasks import ServiceMain, service_main

from . import app
from .settings import Settings


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        settings.common.node.require()
        return lambda stop: app.Service(settings, stop).run()

    return service_main(app.SERVICE, Settings, build, app.__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
