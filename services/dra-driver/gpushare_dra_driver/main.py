"""Entry point: read settings and the vendor table once, set up logs, run until a signal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from gpushare_common.entry import docstring_of, service_main
from gpushare_common.settings import SettingsError
from gpushare_common.vendors import VendorError, load_vendor_table

from .settings import Settings

if TYPE_CHECKING:
    from gpushare_common.tasks import ServiceMain


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        from . import app  # only now: --help needs none of the service

        own = settings.dra
        settings.common.node.require()
        try:
            vendors = load_vendor_table(own.runtime_config)
        except VendorError as err:
            raise SettingsError("GPUSHARE_DRA_RUNTIME_CONFIG", own.runtime_config,
                                f"a readable vendor table ({err})") from None
        return lambda stop: app.Service(settings.common, own, vendors, stop=stop).run()

    return service_main("dra-driver", Settings, build, docstring_of(f"{__package__}.app"), argv)


if __name__ == "__main__":
    sys.exit(main())
