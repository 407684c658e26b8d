"""Entry point: read settings, the node key and the vendor table once, set up logs, run until a signal."""

from __future__ import annotations

import sys

from gpushare_common import ids
from gpushare_common.settings import SettingsError
from gpushare_common.tasks import ServiceMain, service_main
from gpushare_common.vendors import VendorError, load_vendor_table

from . import app
from .settings import Settings


def main(argv: list[str] | None = None) -> int:
    def build(settings: Settings) -> ServiceMain:
        own = settings.deviceplugin
        settings.common.node.require()
        key = ids.load_key(own.signing_key_file)
        try:
            vendors = load_vendor_table(own.runtime_config)
        except VendorError as err:
            raise SettingsError("GPUSHARE_DP_RUNTIME_CONFIG", own.runtime_config,
                                f"a readable vendor table ({err})") from None
        return lambda stop: app.Service(settings.common, own, key, vendors=vendors, stop=stop).run()

    return service_main(app.SERVICE, Settings, build, app.__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
