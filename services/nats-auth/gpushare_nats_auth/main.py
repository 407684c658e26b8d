"""``gpushare-nats-auth``: parse settings and the issuer key once, set up logging, run the callout."""

from __future__ import annotations

import sys

from gpushare_common.tasks import ServiceMain, service_main

from . import app
from .issuer import load_issuer
from .settings import Settings


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        issuer = load_issuer(settings.auth.issuer_seed_file)
        return lambda stop: app.Service(settings, issuer, stop).run()

    return service_main(app.SERVICE, Settings, build, app.__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
