"""Entry point: read settings once, set up logs, run the service until a signal."""

from __future__ import annotations

import sys

from gpushare_common import ids
from gpushare_common import logging as gs_logging
from gpushare_common.settings import SettingsError, load_common
from gpushare_common.tasks import ServiceMain, service_main
from gpushare_common.vendors import VendorError, load_vendor_table

from . import app
from .settings import load_settings

DEFAULT_PORT = 8083


def main() -> int:
    def build() -> ServiceMain:
        common = load_common(default_port=DEFAULT_PORT)
        settings = load_settings()
        common.node.require()
        key = ids.load_key(settings.signing_key_file)
        try:
            vendors = load_vendor_table(settings.runtime_config)
        except VendorError as err:
            raise SettingsError("GPUSHARE_DP_RUNTIME_CONFIG", settings.runtime_config,
                                f"a readable vendor table ({err})") from None
        gs_logging.setup(common.log.level, common.log.json)
        return lambda stop: app.run(common, settings, key, stop, vendors)

    return service_main(app.SERVICE, build)


if __name__ == "__main__":
    sys.exit(main())
