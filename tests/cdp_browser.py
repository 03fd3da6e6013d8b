"""Headless Chromium driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``):
the standard library only, no driver package and no browser download.

Chromium reads commands from its file descriptor 3 and writes replies and events to 4, each one JSON
message ended by a NUL byte. Each browser starts with a fresh profile (``--user-data-dir`` in a
temporary folder, removed at its close). Debian's ``chromium`` package (apt) provides the browser, and
``.ci/run`` installs it where it is missing; without one on PATH the tests that need it skip.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any, Optional

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Without the background-networking switches Chromium tries to reach its services on a closed network;
# a container's /dev/shm (64 MiB under Docker's defaults) is too small for its shared memory.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--mute-audio", "--disable-dev-shm-usage", "--remote-debugging-pipe")
COMMAND_FD, REPLY_FD = 3, 4  # what --remote-debugging-pipe reads and writes
SPARE_FD = 10  # above every descriptor the child starts with
WINDOW = (1400, 1100)
REPLY_TIMEOUT_S = 30.0
POLL_S = 0.05


def find_browser() -> Optional[str]:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page; ``evaluate`` runs JavaScript in it and returns the value."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def wire_pipes() -> None:  # in the child, before exec: the pipe ends at the numbers Chromium uses
            # Copied above both numbers first: a pipe end may itself be 3 or 4, and dup2 onto the same
            # number would keep its close-on-exec flag.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, SPARE_FD) for fd in (commands_read, replies_write)]
            for source, target in zip(high, (COMMAND_FD, REPLY_FD)):
                os.dup2(source, target, inheritable=True)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile.name}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_pipes, close_fds=False)
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    # ------------------------------------------------------------------ protocol
    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: Optional[dict] = None, session: bool = False) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    # ------------------------------------------------------------------ page
    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = REPLY_TIMEOUT_S) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # a document being replaced by the next one
                value = None
            if value:
                return value
            time.sleep(POLL_S)
        raise TimeoutError(f"still false after {timeout_s} s: {expression}")

    def navigate(self, url: str) -> None:
        self.evaluate("window.__leaving = true")
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_for("!window.__leaving && document.readyState === 'complete'")

    def reload(self) -> None:
        self.evaluate("window.__leaving = true")
        self.send("Page.reload", {"ignoreCache": True}, session=True)
        self.wait_for("!window.__leaving && document.readyState === 'complete'")

    def click_and_wait(self, selector: str) -> None:
        """Click a link that loads another page, and wait for that page."""
        self.evaluate("window.__leaving = true")
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
        self.wait_for("!window.__leaving && document.readyState === 'complete'")

    def screenshot(self) -> bytes:
        import base64

        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                          session=True)["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)
        self.profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
