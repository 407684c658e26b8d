"""Entry point: read settings once, set up logs, run the solver until a signal."""

from __future__ import annotations

import sys

from gpushare_common.tasks import ServiceMain, service_main

from . import app
from .settings import Settings


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        settings.common.node.require()
        return lambda stop: app.Service(settings.common, settings.solver, stop).run()

    return service_main(app.SERVICE, Settings, build, app.__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
