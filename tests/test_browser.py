"""The report in a real browser: headless Chromium loads it offline, every figure decodes.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
ending in a NUL byte, read from fd 4, written to fd 3), so no Python driver is needed. The test
collects console errors, uncaught exceptions and failed loads, checks each <img> decoded
(naturalWidth > 0), and saves a full-page screenshot to look at.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_report import SURVIVOR, render, settings, write_manifest, write_run
from test_restarts import write

from lmpipe.paths import Layout

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium found (Debian: apt-get install chromium; .ci/system-packages.sh does it)",
)


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, user_data_dir: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies and events on fd 4. Move the child's
        # ends above 10 first, so that placing them on 3 and 4 cannot overwrite one another.
        child_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def place_pipes() -> None:  # in the child, before exec; dup2 leaves 3 and 4 inheritable
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={user_data_dir}",
                "--remote-debugging-pipe",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # keep 3 and 4; Python's own descriptors are non-inheritable
            preexec_fn=place_pipes,
        )
        os.close(child_r)
        os.close(child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 60
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


IMAGE_CHECK = """JSON.stringify(Array.from(document.images).map(img => ({
    alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight})))"""


@contextmanager
def open_page(url: str, domains: tuple[str, ...] = ("Page", "Runtime", "Log")):
    """(browser, session) of a fresh headless Chromium with `url` loaded and `domains`' events
    enabled; the browser closes on leaving."""
    with tempfile.TemporaryDirectory(prefix="lmpipe-chromium-") as profile:
        browser = DevTools(profile)
        try:
            target = browser.send("Target.createTarget", url="about:blank")["targetId"]
            session = browser.send("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            for domain in domains:
                browser.send(f"{domain}.enable", session)
            browser.send("Page.navigate", session, url=url)
            browser.wait_for("Page.loadEventFired")
            yield browser, session
        finally:
            browser.close()


def open_in_chromium(html_file: Path, screenshot: Path) -> dict[str, Any]:
    """Load `html_file`; return its images, the errors seen, and write a full-page screenshot."""
    with open_page(html_file.resolve().as_uri()) as (browser, session):
        images = json.loads(
            browser.send("Runtime.evaluate", session, expression=IMAGE_CHECK)["result"]["value"]
        )
        shot = browser.send(
            "Page.captureScreenshot", session, format="png", captureBeyondViewport=True
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = [
            e["params"]
            for e in browser.events
            if e.get("method") == "Runtime.exceptionThrown"
            or (
                e.get("method") == "Runtime.consoleAPICalled"
                and e["params"]["type"] in ("error", "assert")
            )
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
        ]
    return {"images": images, "errors": errors}


@pytest.fixture
def report_file(tmp_path: Path) -> Path:
    """A two-run report (one unfinished, one with restarts), with HellaSwag measured during
    training: 5 figures (losses against tokens and against wall time, lr, throughput,
    HellaSwag)."""
    layout = Layout(results=str(tmp_path / "results"), data=str(tmp_path / "data"))
    write_manifest(layout)
    write_run(layout, "a", hellaswag_curve=True)
    write(Path(layout.attempts("a")), SURVIVOR)
    write_run(layout, "b", loss0=8.0, finished=False)
    render(layout, {"a": settings(3e-3), "b": settings(1e-3)}, tmp_path)
    return tmp_path / "report.html"


def test_report_renders_in_chromium(report_file: Path, tmp_path: Path) -> None:
    screenshot = Path(os.environ.get("LMPIPE_SCREENSHOT", tmp_path / "report.png"))
    seen = open_in_chromium(report_file, screenshot)
    assert seen["errors"] == []
    assert len(seen["images"]) == 5, seen["images"]
    for img in seen["images"]:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_broken_figure_fails_the_check(report_file: Path, tmp_path: Path) -> None:
    """The check above can fail: a corrupt figure is caught as undecoded and as a load error."""
    html = report_file.read_text()
    start = html.index("data:image/png;base64,") + len("data:image/png;base64,")
    broken = tmp_path / "broken.html"
    broken.write_text(html[:start] + "AAAA" + html[start + 4 :])  # clobber the PNG signature
    seen = open_in_chromium(broken, tmp_path / "broken.png")
    assert [img["width"] for img in seen["images"]].count(0) == 1
