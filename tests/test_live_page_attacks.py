"""The live page under the two attacks of issue 37 (items 10 and 11), on loopback, the attacker in a process of
its own (tests/support/page_attack.py): a viewer polling ``/state.json`` is still answered, within 2 s, at least 9
times in 10. The page the threading server served failed both (7 to 11 of 36 polls unanswered over 20 s);
``bench/live_page.py`` measures the same attacks for 20 s on the real board app, with the viewer's latency.

Bounded: the attack stops after ``ATTACK_S`` seconds and closes every socket it opened; the attacker
process is killed if it outlives its time; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import time
from typing import Iterator

import pytest
from support.page_attack import attack, attack_result, summary, viewer

from hydra_edge.runtime.live_page import LivePage, PageState

ATTACK_S = 8.0  # the viewer's 10 polls fall within it, after the attack has built up
RAMP_S = 1.5  # the slowloris's sockets are all open and trickling, the flood's threads all fetching
POLLS = 10


@pytest.fixture
def page() -> Iterator[LivePage]:
    with LivePage(lambda: PageState(heads=3, images=1), port=0) as p:
        yield p


@pytest.mark.slow
@pytest.mark.parametrize("kind, size", [("slowloris", 200), ("flood", 50)])
def test_a_viewer_is_answered_while_a_client_attacks_the_page(page: LivePage, kind: str, size: int) -> None:
    """slowloris: 200 sockets opened at once, each sending a header line a second and never a whole head (one
    closed is opened again); flood: 50 threads fetching ``/`` back to back. The viewer polls every 0.5 s with
    a 2 s timeout meanwhile: at least 9 of its 10 polls answered (the goal, p90 under 1 s, is the bench's)."""
    port = int(page.url.rsplit(":", 1)[1].strip("/"))
    attacker = attack(kind, "127.0.0.1", port, ATTACK_S, size)
    try:
        time.sleep(RAMP_S)
        latencies = viewer("127.0.0.1", port, POLLS, period_s=0.5, timeout=2.0)
        assert attacker.poll() is None, "the attack ended before the viewer's last poll"
        counts = attack_result(attacker, ATTACK_S + 30)
    finally:
        if attacker.poll() is None:
            attacker.kill()
            try:
                attacker.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    seen = summary(latencies)
    assert seen["answered"] >= POLLS - 1, (seen, counts)
    if kind == "slowloris":  # the attack was one: the server closed trickling sockets, the attacker opened more
        assert counts["opened"] > size and counts["closed_by_server"] > 0, counts
    else:
        assert counts["answered"] > 0, counts
