"""``gpushare-nats-auth``: parse settings and the issuer key once, set up logging, run the callout."""

from __future__ import annotations

import sys

from gpushare_common import logging as gslog
from gpushare_common.tasks import ServiceMain, service_main

from .app import SERVICE, run
from .issuer import load_issuer
from .settings import load_settings


def main() -> int:
    def build() -> ServiceMain:
        settings = load_settings()
        issuer = load_issuer(settings.auth.issuer_seed_file)
        gslog.setup(settings.common.log.level, settings.common.log.json)
        return lambda stop: run(settings, issuer, stop)

    return service_main(SERVICE, build)


if __name__ == "__main__":
    sys.exit(main())
