"""``gpushare-detector``: parse settings once, set up logging, run the service."""

from __future__ import annotations

from gpushare_common import logging as gslog
from gpushare_common.tasks import ServiceMain, service_main

from .app import SERVICE, run
from .settings import load_settings


def main() -> int:
    def build() -> ServiceMain:
        settings = load_settings()
        settings.common.node.require()
        gslog.setup(settings.common.log.level, settings.common.log.json)
        return lambda stop: run(settings, stop)

    return service_main(SERVICE, build)
