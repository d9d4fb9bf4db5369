"""The live page on real loopback sockets: what it serves, what it refuses, what clients cannot do to it,
how often it asks the app for a snapshot however many watch (the page in a browser, on the real app:
test_board_under_load.py)."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from hydra_edge.runtime import live_page
from hydra_edge.runtime.live_page import MAX_STREAMS, LivePage, LivePageError, PageState, Point, Switch, parse_address

TICK_S = 0.1  # faster than the default so a test sees several ticks in a second


class App:
    """A scripted app: the state it shows, and how many times the page asked for it."""

    def __init__(self) -> None:
        self.heads, self.calls, self.fail = 3, 0, False
        self.lock = threading.Lock()

    def snapshot(self) -> PageState:
        with self.lock:
            self.calls += 1
            if self.fail:
                raise RuntimeError("thermal zone 0 unreadable")
            return PageState(heads=self.heads, t=float(self.calls), budget_ms=2.0, p50_ms=1.1, p90_ms=1.6,
                             temp_c=48.5, battery_pct=71.0, charging=False, predicted="seven", images=self.calls,
                             switches=[Switch(0.0, None, 3, "start")],
                             history=[Point(float(i), self.heads, 1.0 + i % 3) for i in range(20)])


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
def page(app: App) -> Iterator[LivePage]:
    with LivePage(app.snapshot, port=0, tick_s=TICK_S) as p:
        yield p


def port_of(page: LivePage) -> int:
    return int(page.url.rsplit(":", 1)[1].strip("/"))


def get(page: LivePage, path: str, method: str = "GET", headers: Optional[Dict[str, str]] = None
        ) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port_of(page), timeout=5)
    conn.request(method, path, headers=headers or {})
    return conn.getresponse()


def state(page: LivePage) -> Dict[str, Any]:
    response = get(page, "/state.json")
    assert response.status == 200 and response.getheader("Content-Type") == "application/json"
    return json.loads(response.read())


def raw(page: LivePage, data: bytes) -> bytes:
    """What the server answers to ``data`` sent as is on a fresh connection."""
    with socket.create_connection(("127.0.0.1", port_of(page)), timeout=5) as s:
        s.sendall(data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return answer
            answer += chunk


class Stream:
    """An ``/events`` client reading ticks one by one."""

    def __init__(self, page: LivePage) -> None:
        self.response = get(page, "/events")
        self.status = self.response.status

    def tick(self) -> Dict[str, Any]:
        while True:
            line = self.response.readline()
            assert line, "the stream ended"
            if line.startswith(b"data: "):
                return json.loads(line[len(b"data: "):])

    def close(self) -> None:
        self.response.close()


def test_page_and_state_are_served(page: LivePage) -> None:
    response = get(page, "/")
    body = response.read().decode()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/html")
    assert 'id="heads"' in body and "<canvas" in body and "http" not in body.split("<body>")[1]  # nothing fetched
    assert "default-src 'none'" in response.getheader("Content-Security-Policy")
    head = get(page, "/", "HEAD")
    assert head.status == 200 and head.read() == b""
    tick = state(page)
    assert tick["error"] is None and tick["state"]["heads"] == 3 and tick["state"]["predicted"] == "seven"


def shown_in_a_browser(state: PageState, *ids: str) -> Dict[str, Optional[str]]:
    """What a person reads in the elements ``ids`` of the page serving ``state`` (once it has rendered)."""
    from support.browser import Chromium

    with LivePage(lambda: state, port=0, tick_s=TICK_S) as page:
        browser = Chromium(page.url)
        try:
            deadline = time.monotonic() + 30
            while browser.text("heads") != str(state.heads) and time.monotonic() < deadline:
                time.sleep(0.1)
            return {i: browser.text(i) for i in ids}
        finally:
            browser.close()


@pytest.mark.parametrize("power, battery, charging", [
    ({"battery_pct": None, "charging": None, "mains": True}, "mains", "no battery"),
    ({"battery_pct": 71.0, "charging": False}, "71 %", "on battery"),
    ({"battery_pct": 40.0, "charging": True}, "40 %", "charging"),
    ({"battery_pct": None, "charging": None, "battery_assumed": True}, "\u2013",
     "unreadable: the lowest band is assumed"),
], ids=["no battery", "discharging", "charging", "unreadable"])
def test_a_browser_shows_mains_for_a_board_without_a_battery(power: Dict[str, Any], battery: str,
                                                            charging: str) -> None:
    """What a person reads on the page's battery card: a Pi on mains (its profile names no battery) is
    "mains", never "on battery"; a board with one shows its charge and whether it charges."""
    shown = shown_in_a_browser(PageState(heads=3, t=12.5, switches=[Switch(1.5, None, 3, "start")], **power),
                               "battery", "charging", "switches")
    assert (shown["battery"], shown["charging"]) == (battery, charging)
    assert shown["switches"] == "1.5 s: start \u2192 3 heads, start"


def test_the_page_says_what_it_assumes_and_why_the_budget_is_what_it_is() -> None:
    """Issue 44: an unknown temperature showed a bare dash, and a budget of 40 ms against the table's 80 did
    not say the lowest battery band halved it. The page says both, and the switcher's notes."""
    state = PageState(heads=3, t=12.5, budget_ms=40.0, planned_budget_ms=80.0, p50_ms=20.0, thermal_assumed=True,
                      battery_pct=12.0, charging=False, notes=["thermal unknown since 31 s"])
    shown = shown_in_a_browser(state, "temp", "thermal", "p50", "notes")
    assert (shown["temp"], shown["thermal"]) == ("\u2013", "unknown: the hottest band is assumed")
    assert shown["p50"] == "p50 20.00 ms, budget 40.00 ms (the table's 80.00 ms x 0.50 for this battery band)"
    assert shown["notes"] == "thermal unknown since 31 s"


def test_the_stream_follows_the_state(page: LivePage, app: App) -> None:
    stream = Stream(page)
    assert stream.status == 200 and stream.response.getheader("Content-Type") == "text/event-stream"
    first, second = stream.tick(), stream.tick()
    assert second["seq"] > first["seq"] and first["state"]["heads"] == 3
    with app.lock:
        app.heads = 12
    seen = [stream.tick()["state"]["heads"] for _ in range(3)]
    assert seen[-1] == 12
    stream.close()


def test_a_client_gone_mid_stream_leaves_the_others_served(page: LivePage) -> None:
    other = Stream(page)
    with socket.create_connection(("127.0.0.1", port_of(page)), timeout=5) as gone:
        gone.sendall(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        while b"data: " not in received:
            received += gone.recv(65536)
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, as a dropped link
    seqs = [other.tick()["seq"] for _ in range(5)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert state(page)["state"]["heads"] == 3
    more = [Stream(page) for _ in range(MAX_STREAMS - 1)]  # the gone client's slot is free again
    assert [s.status for s in more] == [200] * (MAX_STREAMS - 1)
    for s in [other, *more]:
        s.close()


def test_streams_are_limited_and_a_closed_one_frees_its_slot(page: LivePage) -> None:
    streams = [Stream(page) for _ in range(MAX_STREAMS)]
    assert all(s.status == 200 for s in streams)
    refused = get(page, "/events")
    assert refused.status == 503 and refused.getheader("Retry-After")
    streams.pop().close()
    deadline = time.monotonic() + 3  # the closed stream's thread notices at its next write
    while (again := get(page, "/events")).status == 503 and time.monotonic() < deadline:
        time.sleep(TICK_S)
    assert again.status == 200
    again.close()
    for s in streams:
        s.close()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_writes_are_refused(page: LivePage, method: str) -> None:
    response = get(page, "/state.json", method)
    assert response.status == 405 and response.getheader("Allow") == "GET, HEAD"
    assert state(page)["state"]["heads"] == 3


@pytest.mark.parametrize("target, status", [
    ("/../../etc/passwd", 404), ("/%2e%2e/%2e%2e/etc/passwd", 404), ("/%2E%2E%2Fetc%2Fpasswd", 404),
    ("/..%2f..%2fetc/passwd", 404), ("/state.json/../../etc/passwd", 404), ("//etc/passwd", 404),
    ("/state.json?file=/etc/passwd", 404), ("/events%00", 404), ("/index.html", 404), ("/live_page.py", 404),
    ("http://127.0.0.1/state.json", 400), ("file:///etc/passwd", 400), ("*", 400), ("..", 400),
])
def test_nothing_but_the_three_paths_is_reachable(page: LivePage, target: str, status: int) -> None:
    answer = raw(page, f"GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    assert answer.startswith(f"HTTP/1.0 {status} ".encode()), answer[:80]
    assert b"root:" not in answer and b"import" not in answer


@pytest.mark.parametrize("garbage, status", [
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\xde\xad\r\n\r\n", 400),  # a TLS hello on the plain port
    (b"HELLO\r\n\r\n", 400), (b"GET /\r\n\r\n", 400), (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\n" + b"X-Junk: " + b"a" * 9000 + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
])
def test_garbage_is_answered_400_and_serving_goes_on(page: LivePage, garbage: bytes, status: int) -> None:
    assert raw(page, garbage).startswith(f"HTTP/1.0 {status} ".encode())
    assert state(page)["state"]["heads"] == 3


def test_a_slow_client_is_cut_off(page: LivePage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_page, "HEAD_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", port_of(page)), timeout=5) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /state.json HTTP/1.1\r\nHost: localhost\r\n":  # a byte every 0.1 s, never a whole head
                s.sendall(bytes([byte]))
                time.sleep(0.1)
            answer = s.recv(100)
        except ConnectionError:
            answer = b""
        cut_after = time.monotonic() - start
    assert answer == b"" and cut_after < 2, (answer, cut_after)  # closed unanswered soon after 0.5 s
    assert state(page)["state"]["heads"] == 3


def test_a_request_for_another_host_is_refused_on_loopback(page: LivePage) -> None:
    """A page elsewhere that rebinds its own name to 127.0.0.1 sends its own name as Host."""
    assert get(page, "/state.json", headers={"Host": f"attacker.example:{port_of(page)}"}).status == 421
    for host in ("localhost", "127.0.0.1:1", "[::1]:8765"):
        assert get(page, "/state.json", headers={"Host": host}).status == 200


def test_a_port_in_use_is_one_line(app: App) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(LivePageError) as e:
            LivePage(app.snapshot, port=port).start()
    message = str(e.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message and "in use" in message
    assert f"--serve 127.0.0.1:{port + 1}" in message


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_an_address_that_is_not_loopback_needs_the_flag(app: App, host: str) -> None:
    with pytest.raises(LivePageError, match="is not a loopback address.*--serve-remote"):
        LivePage(app.snapshot, host=host, port=0).start()


def test_with_the_flag_any_address_serves(app: App) -> None:
    with LivePage(app.snapshot, host="0.0.0.0", port=0, allow_remote=True) as page:
        assert page.url.startswith("http://0.0.0.0:")
        response = get(page, "/state.json", headers={"Host": "board.local:8765"})
        assert response.status == 200 and json.loads(response.read())["state"]["heads"] == 3


@pytest.mark.parametrize("text, address", [("127.0.0.1:8765", ("127.0.0.1", 8765)), ("[::1]:0", ("::1", 0)),
                                           ("9000", ("127.0.0.1", 9000)), ("board.local:80", ("board.local", 80))])
def test_serve_addresses_parse(text: str, address: tuple) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["", ":8765", "host:", "host:http", "host:70000", "1.2.3.4:-1"])
def test_a_bad_serve_address_is_one_line(text: str) -> None:
    with pytest.raises(LivePageError, match="is not HOST:PORT; give e.g. 127.0.0.1:8765"):
        parse_address(text)


def test_a_failing_snapshot_is_shown_and_serving_goes_on(page: LivePage, app: App) -> None:
    with app.lock:
        app.fail = True
    time.sleep(3 * TICK_S)
    tick = state(page)
    assert tick["error"] == "RuntimeError: thermal zone 0 unreadable" and tick["state"]["heads"] == 3  # the last good
    with app.lock:
        app.fail, app.heads = False, 6
    time.sleep(3 * TICK_S)
    tick = state(page)
    assert tick["error"] is None and tick["state"]["heads"] == 6


def test_a_snapshot_of_the_wrong_shape_is_an_error_on_the_page() -> None:
    with LivePage(lambda: {"heads": 3}, port=0) as page:  # type: ignore[arg-type, return-value]
        assert state(page) == {"seq": 1, "state": None,
                               "error": "TypeError: snapshot() returned a dict, not a PageState"}


def test_many_clients_cost_one_snapshot_a_tick(page: LivePage, app: App) -> None:
    """The bound inference pays: 1 / tick_s snapshots a second, whether 1 or 16 clients watch and poll."""
    streams = [Stream(page) for _ in range(MAX_STREAMS)]
    with app.lock:
        before, start = app.calls, time.monotonic()
    received = [0] * MAX_STREAMS

    def watch(i: int) -> None:
        while time.monotonic() - start < 1.5:
            streams[i].tick()
            received[i] += 1

    watchers = [threading.Thread(target=watch, args=(i,)) for i in range(MAX_STREAMS)]
    for w in watchers:
        w.start()
    polls = 0
    while time.monotonic() - start < 1.5:
        state(page)
        polls += 1
    for w in watchers:
        w.join()
    with app.lock:
        calls, seconds = app.calls - before, time.monotonic() - start
    assert calls <= seconds / TICK_S + 1, (calls, seconds)
    assert min(received) >= 5 and polls > calls  # every client was served, and polling took no snapshot
    for s in streams:
        s.close()


def test_a_client_fetching_as_fast_as_it_can_is_answered_at_the_set_rate_and_streams_go_on(page: LivePage) -> None:
    """What bounds a flood's cost to inference: requests answered a second, beyond the burst."""
    stream = Stream(page)
    answered, start = [0], time.monotonic()

    def hammer() -> None:
        while time.monotonic() - start < 2.0:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port_of(page), timeout=0.5)
                conn.request("GET", "/state.json")
                conn.getresponse().read()
                answered[0] += 1
            except OSError:  # waited in the kernel's queue past the timeout
                pass

    flood = [threading.Thread(target=hammer) for _ in range(4)]
    for f in flood:
        f.start()
    seqs = [stream.tick()["seq"] for _ in range(10)]  # 1 s of ticks while the flood goes on
    for f in flood:
        f.join()
    elapsed = time.monotonic() - start
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    assert live_page.REQUEST_BURST < answered[0] <= live_page.REQUEST_BURST + live_page.MAX_REQUESTS_PER_S * elapsed + 2
    stream.close()


def test_stop_ends_streams_and_frees_the_port(app: App) -> None:
    page = LivePage(app.snapshot, port=0, tick_s=TICK_S)
    page.start()
    stream = Stream(page)
    stream.tick()
    port, start = port_of(page), time.monotonic()
    page.stop()
    assert stream.response.read().strip() == b""  # the stream ended, with no tick after stop()
    assert time.monotonic() - start < 2
    with LivePage(app.snapshot, port=port) as again:  # the port is free for the next run
        assert state(again)["state"]["heads"] == 3


def test_the_page_needs_only_the_standard_library_and_msgspec() -> None:
    """Boards run it: no numpy, no torch, no host module."""
    code = ("import sys; before = set(sys.modules); import hydra_edge.runtime.live_page;"
            "new = set(sys.modules) - before;"
            "used = {m.split('.')[0] for m in new} - set(sys.stdlib_module_names);"
            "used.discard('typing_extensions');"  # msgspec imports it where it is installed
            "assert used == {'hydra_edge', 'msgspec'}, used;"
            "assert {m for m in new if m.startswith('hydra_edge.')} <= "
            "{'hydra_edge.errors', 'hydra_edge.runtime', 'hydra_edge.runtime.live_page'}, new")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
