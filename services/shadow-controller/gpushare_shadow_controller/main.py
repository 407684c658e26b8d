"""``gpushare-shadow-controller``: settings from the environment, then run until signalled."""

from __future__ import annotations

import os

from gpushare_common import logging as gslog
from gpushare_common.settings import HttpSettings, KubeSettings, LogSettings, load
from gpushare_common.tasks import ServiceMain, service_main

from .app import SERVICE, AppSettings, ShadowControllerApp
from .settings import ShadowSettings


def main() -> int:
    def build() -> ServiceMain:
        log_settings = load(LogSettings, "GPUSHARE_LOG_")
        settings = AppSettings(
            shadow=load(ShadowSettings, "GPUSHARE_SHADOW_"),
            kube=load(KubeSettings, "GPUSHARE_KUBE_"),
            http=load(HttpSettings, "GPUSHARE_HTTP_", {"GPUSHARE_HTTP_PORT": "8084", **os.environ}),
        )
        settings.shadow.tolerations_list()
        settings.shadow.node_selector_map()
        gslog.setup(log_settings.level, log_settings.json)
        return lambda stop: ShadowControllerApp(settings, stop=stop).run()

    return service_main(SERVICE, build)
