"""Entry point: read settings and the vendor table once, set up logs, run until a signal."""

from __future__ import annotations

import sys

from gpushare_common import logging as gs_logging
from gpushare_common.settings import SettingsError, load_common
from gpushare_common.tasks import ServiceMain, service_main
from gpushare_common.vendors import VendorError, load_vendor_table

from . import app
from .settings import load_settings

DEFAULT_PORT = 8086


def main() -> int:
    def build() -> ServiceMain:
        common = load_common(default_port=DEFAULT_PORT)
        settings = load_settings()
        common.node.require()
        try:
            vendors = load_vendor_table(settings.runtime_config)
        except VendorError as err:
            raise SettingsError("GPUSHARE_DRA_RUNTIME_CONFIG", settings.runtime_config,
                                f"a readable vendor table ({err})") from None
        gs_logging.setup(common.log.level, common.log.json)
        return lambda stop: app.run(common, settings, vendors, stop)

    return service_main(app.SERVICE, build)


if __name__ == "__main__":
    sys.exit(main())
