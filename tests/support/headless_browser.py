"""Open a local page in headless Chromium (Debian's `chromium`) and speak the DevTools protocol to it over
`--remote-debugging-pipe` (fds 3 and 4, NUL-separated JSON): no extra package, no network port.

`open_page` returns the page's console errors, uncaught exceptions and failed loads (a missing image is a
Log entry of level "error"), the images that did not decode, the text as rendered, and a full-page PNG
screenshot.
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
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-pipe")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return None


@dataclass
class PageVisit:
    errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    title: str = ""
    height: int = 0
    text: str = ""  # the rendered text (innerText: what a reader sees, tables as tab-separated cells)


class _Pipe:
    def __init__(self, to_browser: int, from_browser: int) -> None:
        self.out = os.fdopen(to_browser, "wb", buffering=0)
        self.inp = os.fdopen(from_browser, "rb", buffering=0)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = self.inp.read(65536)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)


def _above_ten(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


def open_page(page: Path, screenshot: Path, width: int = 1280, timeout: float = 120) -> PageVisit:
    """Load `page` (a local file) and write a full-page screenshot to `screenshot`."""
    chromium = find_chromium()
    assert chromium, "chromium is not installed"
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # Moved above 10 so that putting them at 3 and 4 in the child cannot overwrite one with the other.
    for fd in (to_browser_r, from_browser_w):
        os.set_inheritable(fd, False)
    to_browser_r, from_browser_w = (_above_ten(fd) for fd in (to_browser_r, from_browser_w))
    with tempfile.TemporaryDirectory(prefix="widenet-chromium-") as profile:
        # The child's fd 3 reads our commands, its fd 4 writes the answers (what --remote-debugging-pipe expects).
        def child_fds() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=child_fds, pass_fds=(3, 4))
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(to_browser_w, from_browser_r)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
            pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            pipe.wait_for("Page.loadEventFired", timeout=timeout)
            probe = ("JSON.stringify({title: document.title, height: document.documentElement.scrollHeight, "
                     "text: document.body.innerText, "
                     "broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
                     ".map(i => i.getAttribute('src'))})")
            state = json.loads(pipe.send("Runtime.evaluate", {"expression": probe, "returnByValue": True},
                                         session=session)["result"]["value"])
            shot = pipe.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": state["height"], "scale": 1}}, session=session)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            visit = PageVisit(title=state["title"], height=state["height"], broken_images=state["broken"],
                              text=state["text"])
            for event in pipe.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    visit.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                               for a in params.get("args", [])))
                elif method == "Runtime.exceptionThrown":
                    visit.errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
                elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                    entry = params["entry"]
                    visit.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
            try:
                pipe.send("Browser.close", timeout=10)
            except (RuntimeError, TimeoutError):
                pass  # the browser may close the pipe before answering
            return visit
        finally:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pipe.out.close()
            pipe.inp.close()
