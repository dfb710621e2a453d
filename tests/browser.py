"""A real headless Chromium driven over the Chrome DevTools protocol on a pipe (no extra Python package).

``Browser.open(url)`` loads a page in a fresh tab and records what a user's browser would show: console
messages, uncaught exceptions, log entries (a Content-Security-Policy violation lands there) and every request
the page makes. ``evaluate`` runs JavaScript in the page, ``mouse`` sends real input events and ``screenshot``
saves a PNG, ``viewport`` sets the window size the page sees. Chromium is Debian's (``apt-get install
chromium``); ``find_chromium`` returns None without it.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("ANYSR_CHROMIUM")
    if env and Path(env).is_file():
        return env
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Browser:
    """One headless Chromium process; ``with Browser(exe, profile_dir) as b: ...``."""

    def __init__(self, exe: str, profile: Path, width: int = 1280, height: int = 1600) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        os.set_inheritable(to_chrome_r, True)
        os.set_inheritable(from_chrome_w, True)

        def child_fds() -> None:  # Chromium reads commands on fd 3 and answers on fd 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-sandbox",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--mute-audio", "--hide-scrollbars", f"--window-size={width},{height}",
                "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=child_fds, close_fds=False,  # noqa: PLW1509
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # ------------------------------------------------------------------ protocol
    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def _read_one(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe (did it start?)")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any] | None = None, *, page: bool = True,
             timeout: float = 30) -> dict[str, Any]:
        """Send a command (to the page's session unless ``page=False``) and return its result."""
        msg_id = self._send(method, params, self.session if page else None)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg

    # ------------------------------------------------------------------ page
    def open(self, url: str) -> None:
        """A new tab with console, log, network and page events on, then ``url`` loaded."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 page=False)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self.events.clear()
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def viewport(self, width: int, height: int) -> None:
        """Show the page as a ``width`` x ``height`` window would (a resize event reaches the page)."""
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression (promises awaited); a page exception is raised here."""
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, timeout=timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **extra: Any) -> None:
        """A real input event: ``mouseWheel`` (deltaY=...), ``mousePressed`` / ``mouseMoved`` / ``mouseReleased``."""
        params = {"type": kind, "x": x, "y": y, **extra}
        if kind in ("mousePressed", "mouseReleased"):
            params.setdefault("button", "left")
            params.setdefault("clickCount", 1)
        elif kind == "mouseWheel":
            params.setdefault("deltaX", 0)
        self.call("Input.dispatchMouseEvent", params)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    # ------------------------------------------------------------------ what the page did
    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries (CSP violations, failed loads)."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails", {}).get("exception", {}).get("description", p)))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text")))
        return out

    def requests(self) -> list[str]:
        """URLs of every request the page made (its own file included)."""
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    # ------------------------------------------------------------------ life
    def close(self) -> None:
        try:
            self._send("Browser.close")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
