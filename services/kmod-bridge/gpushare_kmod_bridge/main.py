"""Entry point: read settings once, set up logs, run the bridge until a signal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from gpushare_common.entry import docstring_of, service_main

from .settings import Settings

if TYPE_CHECKING:
    from gpushare_common.tasks import ServiceMain


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        from . import app  # only now: --help needs none of the service

        settings.common.node.require()
        return lambda stop: app.Service(settings.common, settings.kmod, stop=stop).run()

    return service_main("kmod-bridge", Settings, build, docstring_of(f"{__package__}.app"), argv)


if __name__ == "__main__":
    sys.exit(main())
