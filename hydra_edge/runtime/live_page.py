"""The board's live page: what the device is doing and why, in a browser on the same network or through ``ssh -L``.

``LivePage(snapshot)`` serves three read-only things over HTTP (one thread around a selector, the
standard library's request parser; msgspec encodes, as everywhere on the device side; no torch, no numpy, no files served):

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
path that is not one of the three (404; a request target that is not a path, 400), keep others out by
sending its request slowly (the whole head within ``HEAD_TIMEOUT_S``, ``MAX_HEAD_BYTES`` at most; a
trickling socket holds no thread) or by not reading (a send that waits ``SEND_TIMEOUT_S`` ends its
connection), by opening many connections (``MAX_CONNECTIONS``, ``MAX_CONNECTIONS_PER_HOST`` from one
address; when full, the oldest still sending its head is closed for the newcomer) or ``MAX_STREAMS``
streams (503), or cost inference more than ``MAX_REQUESTS_PER_S`` answers a second (beyond a burst of
``REQUEST_BURST``; the rest wait their turn, round-robin by client address). A
client that goes away mid-stream frees its stream's slot; garbage is answered 400. When the page is
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
import io
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

import msgspec

from ..errors import HydraEdgeError

log = logging.getLogger("hydra_edge.live_page")

TICK_S = 0.5  # one snapshot per tick, shared by every client
MAX_STREAMS = 16  # concurrent /events clients; the next gets 503
MAX_CONNECTIONS = 512  # open at once; when full, the oldest still sending its head is closed for the next
MAX_CONNECTIONS_PER_HOST = 256  # from one client address, the same way
BACKLOG = 128  # the kernel's queue of connections not yet taken (the loop takes them as they come)
# Requests answered a second on average; the rest wait their turn, by address. 75: a flood costs the board
# 2.3-2.7 % of a core (3.0-3.3 % at 100) and a viewer behind it waits 0.68 s (bench/results/live_page_attacks.md).
MAX_REQUESTS_PER_S = 75.0
REQUEST_BURST = 50  # answered at once after a quiet spell (every viewer reconnecting after a restart)
MAX_HEAD_BYTES = 8192  # request line and headers together; more is 414 or 431
HEAD_TIMEOUT_S = 2.0  # to receive the whole request head, however slowly it trickles in
SEND_TIMEOUT_S = 10.0  # one send to a client that does not read
KEEPALIVE_S = 15.0  # a stream with no new tick (a snapshot that hangs) sends a comment this often
MAX_ERROR_CHARS = 500
URL_LINE = "live page: "  # how the board app says where its page serves; deploy and demo read it


class LivePageError(HydraEdgeError):
    """The page cannot be served where asked: a port in use, an address that is not local without the flag."""


class Switch(msgspec.Struct):
    """One change of head count, as the page lists it."""

    t: float  # the app's clock: seconds since it started (the scripted day's clock when one plays)
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
    planned_budget_ms: Optional[float] = None  # the budget before the battery band scaled it (the table's)
    p50_ms: Optional[float] = None  # recent inferences' median latency
    p90_ms: Optional[float] = None  # and their 90th percentile, held to the budget
    temp_c: Optional[float] = None
    battery_pct: Optional[float] = None
    charging: Optional[bool] = None
    mains: bool = False  # the device has no battery (its profile names none): the page says mains, not "on battery"
    thermal_assumed: bool = False  # no temperature could be read: the hottest band is assumed
    battery_assumed: bool = False  # the battery could not be read: the lowest battery band is assumed
    notes: List[str] = []  # why a reading is held or assumed ("thermal unknown since 31 s")
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
    """A request head the serving loop has received whole, read by the standard library's parser as ``rfile``.

    The loop gathers the head without blocking (a client trickling it holds no thread, only a socket,
    until ``HEAD_TIMEOUT_S``); parsing it here keeps every refusal (400, 414, 431, 505) the parser's own.
    At most ``MAX_HEAD_BYTES`` are read: one byte more shows the head is too long. Nothing past it is read.
    """

    def __init__(self, data: bytes) -> None:
        self.buffer, self.taken = data, 0

    def readline(self, size: int = -1) -> bytes:
        limit = MAX_HEAD_BYTES + 1 - self.taken  # one byte more than allowed shows the head is too long
        size = limit if size < 0 else min(size, limit)
        end = self.buffer.find(b"\n", 0, size)
        n = min(size, len(self.buffer)) if end < 0 else end + 1
        line, self.buffer = self.buffer[:n], self.buffer[n:]
        self.taken += n
        if self.taken > MAX_HEAD_BYTES:
            raise http.client.LineTooLong(f"request head over {MAX_HEAD_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    """One request whose head is already in, answered into a buffer (HTTP/1.0: one request a connection).

    Not run by socketserver: the serving loop makes one per head and sends what it wrote. ``/`` and
    ``/state.json`` are not rendered here but taken ready-made from the page (``cached``), encoded once a
    tick; ``/events`` marks the connection a stream (``stream``) that the loop then feeds each tick.
    """

    server: "_Server"  # type: ignore[assignment]
    protocol_version = "HTTP/1.0"
    server_version = "hydra-edge-live"
    sys_version = ""

    def __init__(self, head: bytes, client_address: Any, server: Optional["_Server"]) -> None:  # noqa: D107
        self.rfile = _Head(head)  # type: ignore[assignment]
        self.wfile = io.BytesIO()  # type: ignore[assignment]
        self.client_address, self.server = client_address, server  # type: ignore[assignment]
        self.close_connection, self.requestline, self.command = True, "", ""
        self.cached: Optional[bytes] = None
        self.stream = False

    @classmethod
    def render(cls, status: HTTPStatus, body: bytes, content_type: str, headers: Sequence[Tuple[str, str]] = ()
               ) -> bytes:
        """The whole reply a GET gets, status line and headers included: what the page caches each tick."""
        handler = cls(b"", ("", 0), None)
        handler.request_version, handler.command, handler.requestline = "HTTP/1.0", "GET", "GET (cached)"
        handler._reply(status, body, content_type, headers)
        return handler.wfile.getvalue()  # type: ignore[attr-defined]

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
        if log.isEnabledFor(logging.DEBUG):  # a flood is answered hundreds of times a second: no formatting for nothing
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
        page = self.server.page
        if not self.path.startswith("/"):
            self.send_error(HTTPStatus.BAD_REQUEST, "the request target is not a path on this server")
        elif self.path not in ROUTES:
            self.send_error(HTTPStatus.NOT_FOUND, "the live page serves /, /state.json and /events only")
        elif not page.allow_remote and not _loopback(_host_name(self.headers.get("Host", "localhost"))):
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "this page answers to localhost only")
        elif self.path == "/events":
            self._stream()
        elif self.command == "GET":
            self.cached = page.reply(self.path)
        elif self.path == "/":
            self._reply(HTTPStatus.OK, PAGE, "text/html; charset=utf-8", PAGE_HEADERS)
        else:
            self._reply(HTTPStatus.OK, page.latest()[1], "application/json")

    def _stream(self) -> None:
        """The head of a server-sent event stream; the loop sends the ticks. At most ``MAX_STREAMS``, then 503."""
        if len(self.server.streams) >= MAX_STREAMS:
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, f"{MAX_STREAMS} clients are watching already")
            return
        self.close_connection = True
        self.send_response(HTTPStatus.OK)
        for name, value in [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store"),
                            ("X-Content-Type-Options", "nosniff"), ("Connection", "close")]:
            self.send_header(name, value)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(b"retry: 2000\n\n")  # how soon a browser reconnects after the board restarts
            self.stream = True


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header: ``localhost:8765`` -> ``localhost``, ``[::1]:8765`` -> ``::1``."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


class _Conn:
    """One client connection as the loop sees it: gathering its head, waiting its turn, being sent, or a stream."""

    __slots__ = ("sock", "host", "deadline", "head", "out", "stream", "seq", "last_write", "events", "closed")

    def __init__(self, sock: socket.socket, host: str, now: float) -> None:
        self.sock, self.host, self.deadline = sock, host, now + HEAD_TIMEOUT_S
        self.head = bytearray()
        self.out = memoryview(b"")  # what is left to send
        self.stream, self.seq, self.last_write, self.events, self.closed = False, -1, now, 0, False


class _Server:
    """Every connection on one thread around a selector: what a client holds is a socket, never a thread.

    Why this shape (issue 37): the threading server it replaces took connections at most 20 a second
    from a listen queue of 5, so 200 sockets trickling headers, or 50 threads fetching ``/`` back to back,
    kept a viewer's connection waiting in (or dropped from) the kernel's queue for seconds. Here:

    * connections are taken from the kernel's queue (``BACKLOG``) as fast as they come, up to
      ``MAX_CONNECTIONS`` (``MAX_CONNECTIONS_PER_HOST`` from one address); when full, the oldest
      connection still sending its head is closed for the newcomer (a trickler has had longest to
      finish and a viewer's head comes in one packet), and only when none is, the newcomers wait in
      the kernel's queue;
    * a head must arrive whole within ``HEAD_TIMEOUT_S`` or the socket is closed unanswered; holding
      one costs the board a file descriptor, not a thread, and the loop reads only what arrives;
    * what bounds the cost to inference is the answers: at most ``MAX_REQUESTS_PER_S`` a second beyond
      a burst of ``REQUEST_BURST``, taken round-robin by client address so that one address's queue
      cannot hold another's request back; a client fetching back to back waits for its own answers;
    * ``/`` and ``/state.json`` are sent as bytes made once a tick, not rendered per request.
    """

    def __init__(self, family: int, address: Any, page: "LivePage") -> None:
        self.page = page
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart rebinds at once
            self.listener.bind(address)
            self.listener.listen(BACKLOG)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.server_address = self.listener.getsockname()
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        for s in (self.wake_r, self.wake_w):
            s.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.accepting = True
        self.open = 0
        self.per_host: Dict[str, int] = {}
        self.reading: "OrderedDict[_Conn, None]" = OrderedDict()  # heads still coming in, oldest first
        self.reading_by_host: Dict[str, "OrderedDict[_Conn, None]"] = {}
        self.waiting: "OrderedDict[str, Deque[_Conn]]" = OrderedDict()  # whole heads waiting their turn, by address
        self.sending: Set[_Conn] = set()
        self.streams: Set[_Conn] = set()
        self.tokens, self.refilled = float(REQUEST_BURST), time.monotonic()
        self.checked = 0.0  # when sends and keep-alives were last looked at

    def wake(self) -> None:
        """Make the loop look now (a new tick, or stop)."""
        try:
            self.wake_w.send(b"x")
        except OSError:  # its buffer is full: the loop is waking anyway
            pass

    def serve(self) -> None:
        """The loop, until the page stops; every socket it opened is closed when it returns."""
        try:
            while not self.page.stopping.is_set():
                for key, mask in self.selector.select(self._timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            self.wake_r.recv(4096)
                        except OSError:
                            pass
                    elif not key.data.closed:
                        if mask & selectors.EVENT_READ:
                            self._read(key.data)
                        if mask & selectors.EVENT_WRITE and not key.data.closed:
                            self._send(key.data)
                now = time.monotonic()
                self._expire(now)
                self._publish(now)
                self._answer(now)
        except Exception:  # a bug here must not pass silently: the page would stop answering
            log.exception("live page: the serving loop failed; the page no longer answers")
        finally:
            for conn in [*self.reading, *self.sending, *self.streams,
                         *(c for queue in self.waiting.values() for c in queue)]:
                self._close(conn)
            self.selector.close()
            for s in (self.listener, self.wake_r, self.wake_w):
                s.close()

    def _timeout(self) -> float:
        """How long the selector may wait: until the oldest head's deadline, the next answer's token, or a
        quarter second (sends that stall, keep-alives)."""
        wait = 0.25
        if self.reading:
            wait = min(wait, next(iter(self.reading)).deadline - time.monotonic())
        if self.waiting:
            wait = min(wait, (1 - self.tokens) / MAX_REQUESTS_PER_S)
        return max(wait, 0.0)

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if not events:
            self.selector.unregister(conn.sock)
        elif not conn.events:
            self.selector.register(conn.sock, events, conn)
        else:
            self.selector.modify(conn.sock, events, conn)
        conn.events = events

    def _accept(self) -> None:
        for _ in range(64):  # then the loop goes round: heads and answers are not held up by a burst of connects
            if self.open >= MAX_CONNECTIONS and not self._evict(self.reading):
                self.selector.unregister(self.listener)  # every slot holds a whole request: the rest wait in
                self.accepting = False  # the kernel's queue until one is answered
                return
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: leave the rest queued for a moment
                log.warning("live page: cannot accept a connection: %s", e)
                return
            host = str(address[0])
            if self.per_host.get(host, 0) >= MAX_CONNECTIONS_PER_HOST and not self._evict(
                    self.reading_by_host.get(host, OrderedDict())):
                log.debug("live page: %s holds %d connections, the next closed unanswered", host,
                          MAX_CONNECTIONS_PER_HOST)
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, host, time.monotonic())
            self.open += 1
            self.per_host[host] = self.per_host.get(host, 0) + 1
            self.reading[conn] = None
            self.reading_by_host.setdefault(host, OrderedDict())[conn] = None
            self._read(conn)  # a client's head often arrives with its connection: no selector round for it
            if not conn.closed and conn in self.reading:
                self._watch(conn, selectors.EVENT_READ)

    def _evict(self, reading: "OrderedDict[_Conn, None]") -> bool:
        """Close the oldest connection of ``reading`` still sending its head; False when there is none."""
        if not reading:
            return False
        oldest = next(iter(reading))
        log.debug("live page: %s's connection still sending its head closed for a newcomer", oldest.host)
        self._close(oldest)
        return True

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if conn not in self.reading:  # a stream's client: anything it sends is ignored; its end ends the stream
            if not data:
                self._close(conn)
            return
        if not data:  # the client stopped sending: what came is its request, as the parser reads it
            if conn.head:
                self._complete(conn)
            else:
                self._close(conn)
            return
        start = max(0, len(conn.head) - 2)
        conn.head += data
        if (conn.head.find(b"\n\r\n", start) >= 0 or conn.head.find(b"\n\n", start) >= 0
                or len(conn.head) > MAX_HEAD_BYTES):
            self._complete(conn)

    def _complete(self, conn: _Conn) -> None:
        """The head is in: off the readers, into its address's queue for an answer."""
        del self.reading[conn]
        del self.reading_by_host[conn.host][conn]
        if not self.reading_by_host[conn.host]:
            del self.reading_by_host[conn.host]
        self._watch(conn, 0)
        self.waiting.setdefault(conn.host, deque()).append(conn)

    def _answer(self, now: float) -> None:
        """Answer waiting heads while the rate allows, one address after another."""
        rate = MAX_REQUESTS_PER_S
        self.tokens = min(float(REQUEST_BURST), self.tokens + (now - self.refilled) * rate)
        self.refilled = now
        while self.waiting and self.tokens >= 1:
            host, queue = next(iter(self.waiting.items()))
            conn = queue.popleft()
            if queue:
                self.waiting.move_to_end(host)
            else:
                del self.waiting[host]
            self.tokens -= 1
            self._respond(conn)

    def _respond(self, conn: _Conn) -> None:
        cached = self._plain_get(conn.head)
        if cached is not None:
            conn.head, conn.out = bytearray(), memoryview(cached)
            self._send(conn)
            return
        handler = _Handler(bytes(conn.head[:MAX_HEAD_BYTES + 1]), (conn.host, 0), self)
        try:
            handler.handle_one_request()
        except Exception:  # a bug answering one request: that connection ends, the others go on
            log.debug("live page: request from %s failed", conn.host, exc_info=True)
            self._close(conn)
            return
        conn.head = bytearray()
        out = handler.cached if handler.cached is not None else handler.wfile.getvalue()  # type: ignore[attr-defined]
        if handler.stream:
            conn.stream, (conn.seq, tick) = True, self.page.latest()
            out += b"data: " + tick + b"\n\n"  # a new watcher sees the state at once, not a tick later
            self.streams.add(conn)
        if not out:  # nothing to say (an empty request line): closed, as the standard server does
            self._close(conn)
            return
        conn.out = memoryview(out)
        self._send(conn)

    def _plain_get(self, head: bytearray) -> Optional[bytes]:
        """The cached reply when ``head`` is a plain GET of ``/`` or ``/state.json`` the standard parser would
        answer 200; None for anything else, which the standard parser then answers as it always has.

        Why: the parser costs about 0.2 ms a request, most of what a flood costs the board; a viewer's
        request (a request line, a few ``Name: value`` lines, a loopback ``Host``) needs none of it.
        """
        end = head.find(b"\r\n\r\n")
        if end < 0 or end + 4 != len(head) or len(head) > MAX_HEAD_BYTES:  # too long: 414 or 431, the parser's
            return None
        lines = bytes(head[:end]).split(b"\r\n")
        if len(lines) > 101 or lines[0] not in _PLAIN_GETS:  # the parser answers more than 100 headers 431
            return None
        host = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or not name.isalnum() and not name.replace(b"-", b"").isalnum():
                return None  # a folded line, a name with odd bytes: the parser decides
            if name.lower() == b"expect":
                return None
            if host is None and name.lower() == b"host":
                try:
                    host = value.strip(b" \t").decode("ascii")
                except UnicodeDecodeError:
                    return None
        if not self.page.allow_remote and not _loopback(_host_name(host if host is not None else "localhost")):
            return None  # 421, said by the parser's path
        return self.page.reply(_PLAIN_GETS[lines[0]])

    def _send(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # gone (reset, broken pipe): its slot is free
            self._close(conn)
            return
        if sent:
            conn.out, conn.last_write = conn.out[sent:], time.monotonic()
        if conn.out:
            self.sending.add(conn)
            self._watch(conn, selectors.EVENT_WRITE | (selectors.EVENT_READ if conn.stream else 0))
            return
        self.sending.discard(conn)
        if conn.stream:
            self._watch(conn, selectors.EVENT_READ)  # readable again only when its client goes
        else:
            self._close(conn)

    def _expire(self, now: float) -> None:
        """Close heads past their deadline (the oldest first, so a look at the front is enough) and, four times
        a second, sends a client has not taken for ``SEND_TIMEOUT_S``."""
        while self.reading:
            oldest = next(iter(self.reading))
            if oldest.deadline > now:
                break
            log.debug("live page: %s sent no whole head within %g s: closed unanswered", oldest.host, HEAD_TIMEOUT_S)
            self._close(oldest)
        if now - self.checked < 0.25:
            return
        self.checked = now
        for conn in [c for c in self.sending if now - c.last_write > SEND_TIMEOUT_S]:
            log.debug("live page: %s took nothing for %g s: closed", conn.host, SEND_TIMEOUT_S)
            self._close(conn)
        for conn in [c for c in self.streams if not c.out and now - c.last_write >= KEEPALIVE_S]:
            conn.out = memoryview(b": no new state\n\n")  # finds a client that has gone while a snapshot hangs
            self._send(conn)

    def _publish(self, now: float) -> None:
        """A new tick to every stream that has sent the last one (one still sending it skips this one)."""
        if not self.streams:
            return
        seq, payload = self.page.latest()
        message: Optional[memoryview] = None
        for conn in [c for c in self.streams if c.seq != seq and not c.out]:
            message = message or memoryview(b"data: " + payload + b"\n\n")
            conn.seq, conn.out = seq, message
            self._send(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.events:
            self.selector.unregister(conn.sock)
            conn.events = 0
        conn.sock.close()  # an answer in its buffer is still delivered, then the end
        if conn in self.reading:
            del self.reading[conn]
            del self.reading_by_host[conn.host][conn]
            if not self.reading_by_host[conn.host]:
                del self.reading_by_host[conn.host]
        self.sending.discard(conn)
        self.streams.discard(conn)
        self.open -= 1
        self.per_host[conn.host] -= 1
        if not self.per_host[conn.host]:
            del self.per_host[conn.host]
        if not self.accepting and not self.page.stopping.is_set():
            self.selector.register(self.listener, selectors.EVENT_READ, "accept")
            self.accepting = True


class LivePage:
    """Serves the live page for ``snapshot`` (see the module docstring); ``start()`` it, ``stop()`` it, or use ``with``.

    ``snapshot()`` is called on the page's ticker thread every ``tick_s`` seconds while serving,
    so it must be safe to call beside inference (take the app's lock, copy, return). An address
    that is not loopback needs ``allow_remote=True``.
    """

    def __init__(self, snapshot: Callable[[], PageState], host: str = "127.0.0.1", port: int = 8765,
                 allow_remote: bool = False, tick_s: float = TICK_S) -> None:
        self.snapshot, self.host, self.port, self.allow_remote, self.tick_s = snapshot, host, port, allow_remote, tick_s
        self._changed = threading.Condition()
        self.stopping = threading.Event()
        self._seq, self._payload = 0, msgspec.json.encode(Tick(0, None, None))
        self._replies: Dict[str, bytes] = {}
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
        self.stopping.clear()
        self._tick()  # /state.json has a state from the first request on
        self._threads = [threading.Thread(target=self._server.serve, name="live-page-server", daemon=True),
                         threading.Thread(target=self._tick_forever, name="live-page-ticker", daemon=True)]
        for thread in self._threads:
            thread.start()
        log.info("live page on %s", self.url)
        return self.url

    def stop(self) -> None:
        """Stop serving: every connection closed (streams end), the port freed; returns within a snapshot's time."""
        if self._server is None:
            return
        self.stopping.set()
        with self._changed:
            self._changed.notify_all()
        self._server.wake()
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

    def reply(self, path: str) -> bytes:
        """The whole reply to a GET of ``/`` or ``/state.json``, made at the latest tick."""
        with self._changed:
            return self._replies[path]

    def next_tick(self, seen: int, timeout: float) -> Optional[Tuple[int, bytes]]:
        """The first tick after ``seen``, or the latest one after ``timeout`` seconds; None once stopping."""
        with self._changed:
            self._changed.wait_for(lambda: self._seq != seen or self.stopping.is_set(), timeout)
            return None if self.stopping.is_set() else (self._seq, self._payload)

    def _tick_forever(self) -> None:
        while not self.stopping.wait(self.tick_s):
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
        replies = {"/": _Handler.render(HTTPStatus.OK, PAGE, "text/html; charset=utf-8", PAGE_HEADERS),
                   "/state.json": _Handler.render(HTTPStatus.OK, payload, "application/json")}
        with self._changed:
            self._seq, self._payload, self._replies = seq, payload, replies
            self._changed.notify_all()
        if self._server is not None:
            self._server.wake()


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
  const scaled = typeof s.budget_ms === "number" && typeof s.planned_budget_ms === "number" &&
    s.budget_ms !== s.planned_budget_ms;
  $("p50").textContent = "p50 " + num(s.p50_ms, 2, " ms") + ", budget " + num(s.budget_ms, 2, " ms") +
    (scaled ? " (the table's " + num(s.planned_budget_ms, 2, " ms") + " x " +
     num(s.budget_ms / s.planned_budget_ms, 2, "") + " for this battery band)" : "");
  $("temp").textContent = num(s.temp_c, 1, " \\u00b0C");
  $("thermal").textContent = s.thermal_assumed ? "unknown: the hottest band is assumed" : "";
  $("battery").textContent = s.mains ? "mains" : num(s.battery_pct, 0, " %");
  $("charging").textContent = s.mains ? "no battery" : s.battery_assumed ? "unreadable: the lowest band is assumed" :
    s.charging === true ? "charging" : s.charging === false ? "on battery" : "";
  $("notes").textContent = (s.notes || []).join("; ");
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
<div class="card"><span>temperature</span><b id="temp">&ndash;</b><span id="thermal"></span></div>
<div class="card"><span>battery</span><b id="battery">&ndash;</b><span id="charging"></span></div>
<div class="card"><img id="thumb" alt="latest image" hidden><span>latest image</span><b id="predicted">&ndash;</b>
<span id="images"></span></div>
</main>
<p id="notes"></p>
<section><canvas id="chart" aria-label="latency (blue) against the budget (red) and heads (yellow)"></canvas></section>
<section><span>switches, newest first (seconds since the app started)</span><ol id="switches"></ol></section>
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
# The request lines whose cached reply a plain head gets without the standard parser (_Server._plain_get).
_PLAIN_GETS = {b"GET %s HTTP/1.%d" % (path, minor): path.decode() for path in (b"/", b"/state.json") for minor in (0, 1)}
