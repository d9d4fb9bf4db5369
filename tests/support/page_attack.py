"""Two attacks on the live page, run in a process of their own, and a legitimate viewer to time beside them.

The attacker must not share the server's process: in one process the attacker's threads and the
server's share one interpreter lock, so the attack is throttled by the server it attacks and looks
harmless (an earlier in-process version measured no harm from either attack). Run as a script it is
the attacker; imported, ``viewer`` is the legitimate client, ``attack`` starts the attacker process.

* ``slowloris``: ``--sockets`` connections opened at once, each sending one header line a second and
  never the blank line that ends a head; one the server closes is opened again at once.
* ``flood``: ``--threads`` threads fetching ``/`` back to back (one connection a request, each read to
  its end), as fast as the server answers.

Both stop after ``--seconds`` and close every socket they opened; the script prints one JSON line
(sockets opened, closed by the server, pages answered, failures) and exits.

    python tests/support/page_attack.py slowloris 127.0.0.1 8765 --seconds 20 --sockets 200
    python tests/support/page_attack.py flood 127.0.0.1 8765 --seconds 20 --threads 50
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import math
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

CONNECT_TIMEOUT_S = 5.0  # a flood thread's connect and read; a dropped SYN is retried by the kernel meanwhile


def slowloris(host: str, port: int, sockets: int, seconds: float) -> Dict[str, int]:
    """Hold ``sockets`` connections sending a header line a second each, for ``seconds``; one thread, non-blocking."""
    end = time.monotonic() + seconds
    selector = selectors.DefaultSelector()
    lines: Dict[socket.socket, int] = {}  # each open socket: the lines it has sent
    counts = {"opened": 0, "closed_by_server": 0, "connect_failed": 0}

    def open_one() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex((host, port))
        if code not in (0, errno.EINPROGRESS):
            s.close()
            counts["connect_failed"] += 1
            return
        counts["opened"] += 1
        lines[s] = 0
        selector.register(s, selectors.EVENT_READ)

    def drop(s: socket.socket) -> None:
        selector.unregister(s)
        del lines[s]
        s.close()

    for _ in range(sockets):  # all at once, as a slowloris tool does
        open_one()
    next_lines = time.monotonic()
    try:
        while time.monotonic() < end:
            for key, _ in selector.select(max(0.0, min(next_lines, end) - time.monotonic())):
                s = key.fileobj  # readable: the server closed it (or answered it: it never should)
                try:
                    gone = not s.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    counts["closed_by_server"] += 1
                    drop(s)  # type: ignore[arg-type]
            if time.monotonic() >= next_lines:
                next_lines += 1.0
                for s in list(lines):
                    line = b"GET / HTTP/1.1\r\n" if lines[s] == 0 else b"X-Slow-%d: y\r\n" % lines[s]
                    try:
                        if s.send(line) == len(line):
                            lines[s] += 1
                    except (BlockingIOError, InterruptedError):
                        pass  # still connecting (a dropped handshake): the same line next second
                    except OSError:
                        counts["closed_by_server"] += 1
                        drop(s)
                while len(lines) < sockets and time.monotonic() < end:
                    open_one()
    finally:
        for s in list(lines):
            drop(s)
        selector.close()
    return counts


def flood(host: str, port: int, threads: int, seconds: float) -> Dict[str, int]:
    """``threads`` threads fetching ``/`` back to back for ``seconds``."""
    end = time.monotonic() + seconds
    lock = threading.Lock()
    counts = {"answered": 0, "failed": 0}

    def hammer() -> None:
        while time.monotonic() < end:
            ok = False
            try:
                with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as s:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    answer = b""
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        answer += chunk
                    ok = answer.startswith(b"HTTP/1.0 200 ")
            except OSError:
                pass
            with lock:
                counts["answered" if ok else "failed"] += 1

    workers = [threading.Thread(target=hammer, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 2 * CONNECT_TIMEOUT_S)
    return counts


def attack(kind: str, host: str, port: int, seconds: float, size: int) -> subprocess.Popen:
    """The attacker in its own process (its result: one JSON line on its stdout)."""
    option = "--sockets" if kind == "slowloris" else "--threads"
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), kind, host, str(port),
                             "--seconds", str(seconds), option, str(size)], stdout=subprocess.PIPE, text=True)


def attack_result(process: subprocess.Popen, timeout: float) -> Dict[str, int]:
    """Wait for the attacker; what it counted."""
    out, _ = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"the attacker exited {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def poll(host: str, port: int, timeout: float) -> Optional[float]:
    """One ``/state.json`` fetch on a fresh connection: its latency in seconds, or None when it was not
    answered 200 within ``timeout`` (refused, closed unanswered, reset or too slow)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/state.json")
        response = conn.getresponse()
        body = response.read()
        took = time.monotonic() - start
        if response.status != 200 or not body.startswith(b"{") or took > timeout:
            return None
        return took
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def viewer(host: str, port: int, polls: int, period_s: float = 0.5, timeout: float = 2.0) -> List[Optional[float]]:
    """A legitimate viewer: ``polls`` fetches of ``/state.json``, one every ``period_s`` (or right after a
    slower one), each given ``timeout``; their latencies, None for each one not answered in time."""
    latencies: List[Optional[float]] = []
    next_at = time.monotonic()
    for _ in range(polls):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at = time.monotonic() + period_s
        latencies.append(poll(host, port, timeout))
    return latencies


def summary(latencies: List[Optional[float]]) -> Dict[str, Any]:
    """p50/p90/max over every poll, an unanswered one counted as infinitely slow (so p90 is None when more
    than a tenth went unanswered), and the answered/unanswered counts."""
    ordered = sorted(math.inf if t is None else t for t in latencies)

    def rank(q: float) -> Optional[float]:
        value = ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
        return None if math.isinf(value) else round(value, 4)

    answered = [t for t in latencies if t is not None]
    return {"polls": len(latencies), "answered": len(answered), "unanswered": len(latencies) - len(answered),
            "p50_s": rank(0.5), "p90_s": rank(0.9), "max_s": rank(1.0),
            "max_answered_s": round(max(answered), 4) if answered else None,
            "median_answered_s": round(statistics.median(answered), 4) if answered else None}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["slowloris", "flood"])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--sockets", type=int, default=200, help="slowloris: connections held")
    p.add_argument("--threads", type=int, default=50, help="flood: threads fetching / back to back")
    args = p.parse_args(argv)
    if args.kind == "slowloris":
        result = slowloris(args.host, args.port, args.sockets, args.seconds)
    else:
        result = flood(args.host, args.port, args.threads, args.seconds)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
