"""``gpushare-nats-auth``: parse settings and the issuer key once, set up logging, run the callout."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from gpushare_common.entry import docstring_of, service_main

from .issuer import load_issuer
from .settings import Settings

if TYPE_CHECKING:
    from gpushare_common.tasks import ServiceMain


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        from . import app  # only now: --help needs none of the service

        issuer = load_issuer(settings.auth.issuer_seed_file)
        return lambda stop: app.Service(settings, issuer, stop).run()

    return service_main("nats-auth", Settings, build, docstring_of(f"{__package__}.app"), argv)


if __name__ == "__main__":
    sys.exit(main())
