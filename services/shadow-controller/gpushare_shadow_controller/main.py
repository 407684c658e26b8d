"""``gpushare-shadow-controller``: settings from the environment, then run until signalled."""

from __future__ import annotations

import os

from gpushare_common import logging as gslog
from gpushare_common.settings import (
    HTTP_PREFIX,
    KUBE_PREFIX,
    LOG_PREFIX,
    HttpSettings,
    KubeSettings,
    LogSettings,
    env_of,
    load,
)
from gpushare_common.tasks import ServiceMain, service_main

from .app import SERVICE, AppSettings, ShadowControllerApp
from .settings import DEFAULT_PORT, PREFIX, ShadowSettings


def main() -> int:
    def build() -> ServiceMain:
        log_settings = load(LogSettings, LOG_PREFIX)
        settings = AppSettings(
            shadow=load(ShadowSettings, PREFIX),
            kube=load(KubeSettings, KUBE_PREFIX),
            http=load(HttpSettings, HTTP_PREFIX, {**env_of(HttpSettings, HTTP_PREFIX, port=DEFAULT_PORT),
                                                  **os.environ}),
        )
        settings.shadow.tolerations_list()
        settings.shadow.node_selector_map()
        gslog.setup(log_settings.level, log_settings.json)
        return lambda stop: ShadowControllerApp(settings, stop=stop).run()

    return service_main(SERVICE, build)
