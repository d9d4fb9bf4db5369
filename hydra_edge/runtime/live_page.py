"""The board's live page: what the device is doing and why, in a browser on the same network or through ``ssh -L``.

``LivePage(snapshot)`` serves three read-only things over HTTP (the standard library's threading
server; msgspec encodes, as everywhere on the device side; no torch, no numpy, no files served):

* ``/`` the page: HTML with its script and style inline, a chart drawn by hand on a ``<canvas>``;
  its Content-Security-Policy lets the browser fetch nothing but this server's own endpoints,
  so nothing leaves the board and a class name cannot inject markup (it is only ever text);
* ``/state.json`` the latest ``Tick``: the app's ``PageState`` and the error of the last snapshot;
* ``/events`` the same ticks as server-sent events, one ``data:`` line each.

Why a ticker: ``snapshot()`` runs on the app's side (it takes the switcher's lock, formats a
thumbnail), so one thread calls it once per ``tick_s`` and encodes it once; every client is sent
those same bytes. Inference pays for ``1 / tick_s`` snapshots a second however many watch, and
for at most ``MAX_STREAMS`` writes of them.

What a client cannot do: change anything (GET and HEAD only; every other method is 405), reach a
path that is not one of the three (404; a request target that is not a path, 400), hold a thread
by sending its request slowly (the whole head within ``HEAD_TIMEOUT_S``, ``MAX_HEAD_BYTES`` at
most) or by not reading (a send that waits ``SEND_TIMEOUT_S`` ends its connection), open more
than ``MAX_CONNECTIONS`` connections (the next is closed unanswered) or ``MAX_STREAMS`` streams
(503), or have more than ``MAX_REQUESTS_PER_S`` requests a second answered (beyond a burst of
``REQUEST_BURST``, connections are accepted no faster: the rest wait in the kernel's queue). A
client that goes away mid-stream ends its own thread; garbage is answered 400. When the page is
served on loopback only, a request naming another host (a DNS-rebinding page in the user's
browser) is refused too. A snapshot that raises is shown on the page as its error text, beside
the last good state; the ticker carries on.

Python 3.9 syntax, like the rest of the device side: boards may run an older Python.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import ipaddress
import logging
import socket
import socketserver
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional, Sequence, Tuple

import msgspec

from ..errors import HydraEdgeError

log = logging.getLogger("hydra_edge.live_page")

TICK_S = 0.5  # one snapshot per tick, shared by every client
MAX_STREAMS = 16  # concurrent /events clients; the next gets 503
MAX_CONNECTIONS = 64  # concurrent connections of any kind; the next is closed unanswered
MAX_REQUESTS_PER_S = 20.0  # connections accepted a second on average; more wait in the kernel's listen queue
REQUEST_BURST = 40  # accepted at once after a quiet spell (every viewer reconnecting after a restart)
MAX_HEAD_BYTES = 8192  # request line and headers together; more is 414 or 431
HEAD_TIMEOUT_S = 5.0  # to receive the whole request head, however slowly it trickles in
SEND_TIMEOUT_S = 10.0  # one send to a client that does not read
KEEPALIVE_S = 15.0  # a stream with no new tick (a snapshot that hangs) sends a comment this often
MAX_ERROR_CHARS = 500
URL_LINE = "live page: "  # how the board app says where its page serves; deploy and demo read it


class LivePageError(HydraEdgeError):
    """The page cannot be served where asked: a port in use, an address that is not local without the flag."""


class Switch(msgspec.Struct):
    """One change of head count, as the page lists it."""

    t: float  # the app's clock, seconds (the scripted day's clock when one plays)
    from_heads: Optional[int]  # None for the first choice
    to_heads: int
    reason: str  # the switcher's reason: "state", "latency p90 1.9 ms over budget 1.2 ms for 10 s", ...


class Point(msgspec.Struct):
    """One point of the chart: the head count running from time ``t`` and the latency of its inferences
    (the board app: the p90 of those of one chart step)."""

    t: float
    heads: int
    latency_ms: float


class PageState(msgspec.Struct, kw_only=True):
    """What the app shows, as ``snapshot()`` returns it: the one shape the app and the page agree on.

    Unknown values are None (a board without a battery, no image classified yet); the page shows a dash.
    Keep ``switches`` and ``history`` short (the page shows the last 10 switches and charts whatever
    history it gets; about 120 points is plenty): they are encoded once per tick.
    """

    heads: int  # the head count running now
    t: float = 0.0  # the app's clock at this snapshot, on the same clock as switches and history
    budget_ms: Optional[float] = None  # the latency budget now (scaled for the battery band)
    p50_ms: Optional[float] = None  # recent inferences' median latency
    p90_ms: Optional[float] = None  # and their 90th percentile, held to the budget
    temp_c: Optional[float] = None
    battery_pct: Optional[float] = None
    charging: Optional[bool] = None
    top1: Optional[float] = None  # held-out top-1 (%) of the head count running
    images: int = 0  # images classified so far
    predicted: Optional[str] = None  # the latest image's predicted class name
    thumbnail: Optional[str] = None  # that image as a data URI ("data:image/png;base64,..."), or None
    switches: List[Switch] = []  # the newest last
    history: List[Point] = []  # the oldest first


class Tick(msgspec.Struct):
    """What ``/state.json`` and each ``/events`` message carry."""

    seq: int  # counts ticks: a client sees whether it missed any
    state: Optional[PageState]  # the last snapshot that succeeded, None before the first
    error: Optional[str]  # why the last snapshot failed, None when it did not


Address = Tuple[str, int]


def parse_address(text: str) -> Address:
    """``HOST:PORT``, ``[IPV6]:PORT`` or ``PORT`` (on 127.0.0.1) as ``(host, port)``, for a ``--serve`` option."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or int(port) > 65535:
        raise LivePageError(f"--serve {text!r} is not HOST:PORT; give e.g. 127.0.0.1:8765 (port 0 picks a free one)")
    return host, int(port)


def _loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) names this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _bind_address(host: str, port: int, allow_remote: bool) -> Tuple[int, Any]:
    """The socket family and address ``host:port`` binds to; refused when it is not loopback and not allowed."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise LivePageError(f"live page port {port!r} is not a port; give one from 1 to 65535 (0 picks a free one)")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise LivePageError(f"cannot serve the live page on {host!r}: {e}; give an address of this board, "
                            f"e.g. 127.0.0.1:{port}") from None
    if not _loopback(sockaddr[0]) and not allow_remote:
        raise LivePageError(f"{host} is not a loopback address, so the live page would be open to the network; "
                            f"give --serve-remote to serve on it, or serve on 127.0.0.1 and open it through ssh -L")
    return family, sockaddr


class _Head:
    """The request's head read from the socket: ``MAX_HEAD_BYTES`` at most, all of it within ``HEAD_TIMEOUT_S``.

    Replaces the handler's ``rfile``: a buffered file's timeout applies to each read, so a client
    sending a byte every few seconds would hold a thread forever. Nothing past the head is read.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer, self.taken = sock, b"", 0
        self.deadline = time.monotonic() + HEAD_TIMEOUT_S

    def readline(self, size: int = -1) -> bytes:
        limit = MAX_HEAD_BYTES + 1 - self.taken  # one byte more than allowed shows the head is too long
        size = limit if size < 0 else min(size, limit)
        while b"\n" not in self.buffer[:size] and len(self.buffer) < size:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"request head not received within {HEAD_TIMEOUT_S:g} s")
            self.sock.settimeout(left)
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buffer += chunk
        end = self.buffer.find(b"\n", 0, size)
        n = min(size, len(self.buffer)) if end < 0 else end + 1
        line, self.buffer = self.buffer[:n], self.buffer[n:]
        self.taken += n
        if self.taken > MAX_HEAD_BYTES:
            raise http.client.LineTooLong(f"request head over {MAX_HEAD_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    """One connection, one request (HTTP/1.0: no keep-alive to hold a thread between requests)."""

    server: "_Server"
    protocol_version = "HTTP/1.0"
    server_version = "hydra-edge-live"
    sys_version = ""
    timeout = SEND_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile = _Head(self.connection)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except http.client.LineTooLong:  # the request line alone (the headers are answered 431 by parse_request)
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {MAX_HEAD_BYTES} bytes")

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # its replies have no status line: a client could not tell a refusal
            self.request_version = "HTTP/1.0"
            self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 requests are not served")
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("live page %s: " + format, self.address_string(), *args)

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """A one-line plain-text reply (never HTML: what a client sent is echoed in ``message``)."""
        status = HTTPStatus(code)
        headers = [("Allow", "GET, HEAD")] if code == HTTPStatus.METHOD_NOT_ALLOWED else []
        if code == HTTPStatus.SERVICE_UNAVAILABLE:
            headers.append(("Retry-After", "5"))
        self.log_error("code %d, message %s", code, message)
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":  # not parsed: still send a status line
            self.request_version = "HTTP/1.0"
        self._reply(status, f"{code} {status.phrase}: {message or status.description}\n".encode("utf-8", "replace"),
                    "text/plain; charset=utf-8", headers)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str,
               headers: Sequence[Tuple[str, str]] = ()) -> None:
        self.close_connection = True
        self.send_response(status)
        for name, value in [("Content-Type", content_type), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                            ("Connection", "close"), *headers]:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self) -> None:
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} refused: the live page is read-only")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        self.connection.settimeout(SEND_TIMEOUT_S)  # the head is in: from here on, sends are what can wait
        page = self.server.page
        if not self.path.startswith("/"):
            self.send_error(HTTPStatus.BAD_REQUEST, "the request target is not a path on this server")
        elif self.path not in ROUTES:
            self.send_error(HTTPStatus.NOT_FOUND, "the live page serves /, /state.json and /events only")
        elif not page.allow_remote and not _loopback(_host_name(self.headers.get("Host", "localhost"))):
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "this page answers to localhost only")
        elif self.path == "/":
            self._reply(HTTPStatus.OK, PAGE, "text/html; charset=utf-8", PAGE_HEADERS)
        elif self.path == "/state.json":
            self._reply(HTTPStatus.OK, page.latest()[1], "application/json")
        else:
            self._stream(page)

    def _stream(self, page: "LivePage") -> None:
        """Ticks as server-sent events until the client goes or the page stops; a held slot per stream."""
        if not page.streams.acquire(blocking=False):
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, f"{MAX_STREAMS} clients are watching already")
            return
        try:
            self.close_connection = True
            self.send_response(HTTPStatus.OK)
            for name, value in [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store"),
                                ("X-Content-Type-Options", "nosniff"), ("Connection", "close")]:
                self.send_header(name, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            self.wfile.write(b"retry: 2000\n\n")  # how soon a browser reconnects after the board restarts
            seq = -1
            while True:
                tick = page.next_tick(seq, KEEPALIVE_S)
                if tick is None:
                    return
                if tick[0] == seq:
                    self.wfile.write(b": no new state\n\n")  # finds a client that has gone while a snapshot hangs
                else:
                    seq = tick[0]
                    self.wfile.write(b"data: " + tick[1] + b"\n\n")
        except OSError as e:  # gone mid-stream (reset, broken pipe) or not reading (timeout): its thread ends
            log.debug("live page stream to %s ended: %s", self.address_string(), e)
        finally:
            page.streams.release()


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header: ``localhost:8765`` -> ``localhost``, ``[::1]:8765`` -> ``::1``."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


class _Server(ThreadingHTTPServer):
    """The threading server with a cap on connections, quiet about clients that fail, and no reverse DNS."""

    daemon_threads = True
    block_on_close = False  # a stream blocked on a client that does not read must not hold stop() up

    def __init__(self, family: int, address: Any, page: "LivePage") -> None:
        self.address_family, self.page = family, page
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.tokens, self.refilled = float(REQUEST_BURST), time.monotonic()
        super().__init__(address, _Handler)

    def get_request(self) -> Tuple[socket.socket, Any]:
        """Accept the next connection once the rate allows (a token bucket, on the serving thread only).

        Each request costs the board's CPU a thread and a parse: a client connecting as fast as it can
        waits in the kernel's listen queue (or is refused by the kernel once that is full) instead of
        costing inference more than ``MAX_REQUESTS_PER_S`` requests a second.
        """
        now = time.monotonic()
        self.tokens = min(float(REQUEST_BURST), self.tokens + (now - self.refilled) * MAX_REQUESTS_PER_S)
        self.refilled = now
        if self.tokens < 1:
            time.sleep((1 - self.tokens) / MAX_REQUESTS_PER_S)
            self.tokens, self.refilled = 1.0, time.monotonic()
        self.tokens -= 1
        return super().get_request()

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's looks up the host's name: slow on a board with no DNS
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.acquire(blocking=False):
            log.debug("live page: %d connections open, %s closed unanswered", MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("live page: request from %s failed", client_address, exc_info=True)


class LivePage:
    """Serves the live page for ``snapshot`` (see the module docstring); ``start()`` it, ``stop()`` it, or use ``with``.

    ``snapshot()`` is called on the page's ticker thread every ``tick_s`` seconds while serving,
    so it must be safe to call beside inference (take the app's lock, copy, return). An address
    that is not loopback needs ``allow_remote=True``.
    """

    def __init__(self, snapshot: Callable[[], PageState], host: str = "127.0.0.1", port: int = 8765,
                 allow_remote: bool = False, tick_s: float = TICK_S) -> None:
        self.snapshot, self.host, self.port, self.allow_remote, self.tick_s = snapshot, host, port, allow_remote, tick_s
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._seq, self._payload = 0, msgspec.json.encode(Tick(0, None, None))
        self._good: Optional[PageState] = None
        self._last_error: Optional[str] = None
        self._server: Optional[_Server] = None
        self._threads: List[threading.Thread] = []
        self.url = ""

    def start(self) -> str:
        """Bind, take the first snapshot, serve on daemon threads; the URL to open (its port the bound one)."""
        if self._server is not None:
            return self.url
        family, address = _bind_address(self.host, self.port, self.allow_remote)
        try:
            self._server = _Server(family, address, self)
        except OSError as e:
            raise LivePageError(_bind_failure(self.host, self.port, e)) from None
        host, port = self._server.server_address[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        self._stopping.clear()
        self._tick()  # /state.json has a state from the first request on
        self._threads = [threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                          name="live-page-server", daemon=True),
                         threading.Thread(target=self._tick_forever, name="live-page-ticker", daemon=True)]
        for thread in self._threads:
            thread.start()
        log.info("live page on %s", self.url)
        return self.url

    def stop(self) -> None:
        """Stop serving: no new connections, streams end at their next tick; returns within about a tick."""
        if self._server is None:
            return
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join()
        self._server, self._threads = None, []

    def __enter__(self) -> "LivePage":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def latest(self) -> Tuple[int, bytes]:
        """The latest tick: its number and its JSON."""
        with self._changed:
            return self._seq, self._payload

    def next_tick(self, seen: int, timeout: float) -> Optional[Tuple[int, bytes]]:
        """The first tick after ``seen``, or the latest one after ``timeout`` seconds; None once stopping."""
        with self._changed:
            self._changed.wait_for(lambda: self._seq != seen or self._stopping.is_set(), timeout)
            return None if self._stopping.is_set() else (self._seq, self._payload)

    def _tick_forever(self) -> None:
        while not self._stopping.wait(self.tick_s):
            self._tick()

    def _tick(self) -> None:
        """One snapshot, encoded once for every client; a failing one keeps the last good state beside its error."""
        seq = self._seq + 1
        try:
            state = self.snapshot()
            if not isinstance(state, PageState):
                raise TypeError(f"snapshot() returned a {type(state).__name__}, not a PageState")
            payload = msgspec.json.encode(Tick(seq, state, None))
            self._good, error = state, None
        except Exception as e:  # the app's bug or a sensor's: shown on the page, serving goes on
            error = f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
            payload = msgspec.json.encode(Tick(seq, self._good, error))
        if error != self._last_error and error is not None:
            log.warning("live page: snapshot failed: %s", error)
        self._last_error = error
        with self._changed:
            self._seq, self._payload = seq, payload
            self._changed.notify_all()


def _bind_failure(host: str, port: int, e: OSError) -> str:
    """One line for a bind that failed: what, where, how to fix."""
    where = f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return (f"cannot serve the live page on {where}: the port is in use (another app, or an earlier run still "
                f"serving); give another port, e.g. --serve {host}:{port + 1}, or stop what holds it")
    if e.errno == errno.EACCES:
        return f"cannot serve the live page on {where}: ports below 1024 need root; give a port from 1024, e.g. 8765"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot serve the live page on {where}: {host} is not an address of this board; give one of its own"
    return f"cannot serve the live page on {where}: {e.strerror or e}"


_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#111;color:#eee}
header{display:flex;gap:1em;align-items:center;padding:.6em 1em;background:#1c1c1c}
h1{font-size:1.1em;margin:0;flex:1}
#live{font-size:.85em;color:#8c8}#live.stale{color:#e96}
#error{background:#622;color:#fdd;padding:.5em 1em;margin:0}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(10em,1fr));gap:.8em;padding:1em}
.card{background:#1c1c1c;border-radius:6px;padding:.6em .8em}
.card b{display:block;font-size:1.8em;font-weight:600}
.card span{color:#999;font-size:.85em}
.over{color:#f77}.ok{color:#8c8}
#thumb{max-width:64px;max-height:64px;image-rendering:pixelated;float:right}
section{padding:0 1em 1em}
canvas{width:100%;height:220px;background:#1c1c1c;border-radius:6px}
ol{margin:.3em 0;padding-left:1.4em}li{margin:.15em 0}
"""

_SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);
const num = (v, digits, unit) => (typeof v === "number" && isFinite(v)) ? v.toFixed(digits) + unit : "\\u2013";
let lastMessage = 0;

function render(tick) {
  lastMessage = Date.now();
  showLive();
  $("error").hidden = !tick.error;
  $("error").textContent = tick.error ? "snapshot failed: " + tick.error : "";
  const s = tick.state;
  if (!s) return;
  $("heads").textContent = String(s.heads);
  $("top1").textContent = num(s.top1, 1, " % held-out top-1");
  $("p90").textContent = num(s.p90_ms, 2, " ms");
  const judged = typeof s.p90_ms === "number" && typeof s.budget_ms === "number";
  $("p90").className = judged ? (s.p90_ms > s.budget_ms ? "over" : "ok") : "";
  $("p50").textContent = "p50 " + num(s.p50_ms, 2, " ms") + ", budget " + num(s.budget_ms, 2, " ms");
  $("temp").textContent = num(s.temp_c, 1, " \\u00b0C");
  $("battery").textContent = num(s.battery_pct, 0, " %");
  $("charging").textContent = s.charging === true ? "charging" : s.charging === false ? "on battery" : "";
  $("predicted").textContent = s.predicted == null ? "\\u2013" : s.predicted;
  $("images").textContent = s.images + " images";
  const thumb = $("thumb");
  const shown = typeof s.thumbnail === "string" && s.thumbnail.startsWith("data:image/");
  thumb.hidden = !shown;
  if (shown && thumb.getAttribute("src") !== s.thumbnail) thumb.src = s.thumbnail;
  const list = $("switches");
  list.textContent = "";
  for (const w of s.switches.slice(-10).reverse()) {
    const li = document.createElement("li");
    li.textContent = num(w.t, 1, " s") + ": " + (w.from_heads == null ? "start" : w.from_heads) +
      " \\u2192 " + w.to_heads + " heads, " + w.reason;
    list.appendChild(li);
  }
  draw(s);
}

function draw(s) {
  const canvas = $("chart"), ctx = canvas.getContext("2d");
  const ratio = window.devicePixelRatio || 1, w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio; canvas.height = h * ratio;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const points = s.history.filter((p) => typeof p.latency_ms === "number" && isFinite(p.latency_ms));
  if (points.length < 2) return;
  const left = 48, right = 60, top = 12, bottom = 20;
  const t0 = points[0].t, span = Math.max(points[points.length - 1].t - t0, 1e-9);
  let maxMs = s.budget_ms || 0, maxHeads = 1;
  for (const p of points) { maxMs = Math.max(maxMs, p.latency_ms); maxHeads = Math.max(maxHeads, p.heads); }
  maxMs = maxMs * 1.15 || 1;
  const x = (t) => left + (t - t0) / span * (w - left - right);
  const y = (v, max) => h - bottom - v / max * (h - top - bottom);
  ctx.font = "11px sans-serif"; ctx.fillStyle = "#999";
  ctx.fillText(maxMs.toFixed(1) + " ms", 2, top + 8); ctx.fillText("0", 2, h - bottom);
  ctx.fillText(maxHeads + " heads", w - right + 2, top + 8);
  ctx.fillText(span.toFixed(0) + " s", w / 2, h - 4);
  if (s.budget_ms) {
    ctx.strokeStyle = "#f77"; ctx.setLineDash([5, 4]); ctx.beginPath();
    ctx.moveTo(left, y(s.budget_ms, maxMs)); ctx.lineTo(w - right, y(s.budget_ms, maxMs)); ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.strokeStyle = "#6af"; ctx.lineWidth = 1.2; ctx.beginPath();
  points.forEach((p, i) => i ? ctx.lineTo(x(p.t), y(p.latency_ms, maxMs)) : ctx.moveTo(x(p.t), y(p.latency_ms, maxMs)));
  ctx.stroke();
  ctx.strokeStyle = "#fc5"; ctx.lineWidth = 2; ctx.beginPath();
  points.forEach((p, i) => {
    if (!i) { ctx.moveTo(x(p.t), y(p.heads, maxHeads)); return; }
    ctx.lineTo(x(p.t), y(points[i - 1].heads, maxHeads)); ctx.lineTo(x(p.t), y(p.heads, maxHeads));
  });
  ctx.stroke();
}

const events = new EventSource("/events");
events.onmessage = (e) => render(JSON.parse(e.data));
function showLive() {
  const stale = Date.now() - lastMessage > 3000;
  $("live").textContent = !lastMessage ? "connecting" : stale ?
    "no update for " + ((Date.now() - lastMessage) / 1000).toFixed(0) + " s" : "live";
  $("live").className = stale ? "stale" : "";
}
setInterval(showLive, 1000);
"""

_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>hydra-edge live</title><style>{style}</style></head><body>
<header><h1>hydra-edge: what the device runs, and why</h1><span id="live" class="stale">connecting</span></header>
<p id="error" hidden></p>
<main>
<div class="card"><span>heads now</span><b id="heads">&ndash;</b><span id="top1"></span></div>
<div class="card"><span>latency p90</span><b id="p90">&ndash;</b><span id="p50"></span></div>
<div class="card"><span>temperature</span><b id="temp">&ndash;</b></div>
<div class="card"><span>battery</span><b id="battery">&ndash;</b><span id="charging"></span></div>
<div class="card"><img id="thumb" alt="latest image" hidden><span>latest image</span><b id="predicted">&ndash;</b>
<span id="images"></span></div>
</main>
<section><canvas id="chart" aria-label="latency (blue) against the budget (red) and heads (yellow)"></canvas></section>
<section><span>switches, newest first</span><ol id="switches"></ol></section>
<script>{script}</script></body></html>
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = _HTML.format(style=_STYLE, script=_SCRIPT).encode()
# The browser enforces what the module docstring promises: this server's endpoints and data: images, nothing else.
PAGE_HEADERS = [("Content-Security-Policy", f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; "
                 f"style-src {_csp_hash(_STYLE)}; img-src data:; connect-src 'self'; base-uri 'none'; "
                 f"form-action 'none'; frame-ancestors 'none'"), ("Referrer-Policy", "no-referrer")]
ROUTES = ("/", "/state.json", "/events")
