"""Debian's headless Chromium for the tests and benches that open the live page in a real browser."""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import shutil
import subprocess
from typing import Any, Dict, Optional


class Chromium:
    """Debian's headless Chromium driven over its DevTools pipe (file descriptors 3 and 4, JSON messages
    ending in a NUL byte): the standard library is enough, no driver or websocket client."""

    def __init__(self, url: str, size: str = "1000,700") -> None:
        binary = shutil.which("chromium")
        if not binary:
            raise RuntimeError("Debian's chromium is not installed: apt-get install chromium "
                               "(the live page is tested in it)")
        child_in, self.to_child = os.pipe()
        self.from_child, child_out = os.pipe()

        def pipes() -> None:  # in the child: its pipe ends as 3 and 4, whatever numbers they had here
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in (child_in, child_out)]
            os.dup2(high[0], 3)  # dup2's copies are inherited; every other descriptor here closes at exec
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", f"--window-size={size}",
             url], preexec_fn=pipes, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(child_in)
        os.close(child_out)
        self.ids, self.buffer = itertools.count(1), b""
        try:
            target = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)["sessionId"]
        except BaseException:
            self.close()
            raise

    def call(self, method: str, session: Optional[str] = None, **params: Any) -> Dict[str, Any]:
        message: Dict[str, Any] = {"id": next(self.ids), "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\0")
            reply = json.loads(line)
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise RuntimeError(f"chromium refused {method}: {reply['error']}")
                return reply["result"]

    def text(self, element_id: str) -> Optional[str]:
        """The text of the page's element ``element_id`` now, None when it has none."""
        expression = f"(e => e && e.textContent)(document.getElementById({json.dumps(element_id)}))"
        return self.call("Runtime.evaluate", self.session, expression=expression,
                         returnByValue=True)["result"].get("value")

    def screenshot(self) -> bytes:
        """The page as it is drawn now, as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", self.session, format="png")["data"])

    def close(self) -> None:
        """Stop the browser by its PID and close the pipes."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass
