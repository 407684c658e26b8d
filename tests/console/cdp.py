"""A real headless Chromium (Debian's ``chromium``) driven over the Chrome DevTools protocol.

Why the DevTools protocol and not Playwright: the protocol is Chromium's own, stable
interface; speaking it needs only a websocket client (``websocket-client``, already installed
with the Kubernetes client), so the browser is exactly the distribution's package and nothing
is downloaded. Playwright's Python package ships its own driver (a Node.js runtime, ~40 MB)
built for one browser revision, and its ``install`` step downloads browsers.

The browser is started with ``--remote-debugging-port=0`` and writes the port it chose into
``DevToolsActivePort`` in its profile directory; one page target is driven through its
websocket: navigate, evaluate JavaScript (results by value), capture PNG screenshots.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

BINARIES = ("chromium", "chromium-browser", "google-chrome")


class BrowserError(RuntimeError):
    """The browser did not start, or a DevTools call failed (the message says which and why)."""


def chromium_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class Browser:
    def __init__(self, binary: str, width: int = 1400, height: int = 1000) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="gpushare-chromium-"))
        argv = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
                "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip
        self._ids = itertools.count(1)
        try:
            self.ws = websocket.create_connection(self._page_socket(), timeout=30, suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def _page_socket(self, timeout: float = 30.0) -> str:
        """The websocket of the browser's first page, once the browser says its port."""
        deadline = time.monotonic() + timeout
        marker = self.profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode} before it listened")
            port = marker.read_text().split("\n", 1)[0] if marker.exists() else ""
            if port.isdigit():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as reply:
                    pages = [t for t in json.load(reply) if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.05)
        raise BrowserError(f"chromium did not open its DevTools port within {timeout}s")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events arriving meanwhile are skipped)."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") != ident:
                continue
            if "error" in reply:
                raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
            return dict(reply.get("result") or {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"page script failed: {details.get('exception', {}).get('description', details)}")
        return result.get("result", {}).get("value")

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout, f"{url} loaded")

    def wait_for(self, expression: str, timeout: float, what: str, every_s: float = 0.02) -> Any:
        """Evaluate ``expression`` until it is truthy; its value, or TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page did not show {what} within {timeout}s")
            time.sleep(every_s)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not only the window)."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)
