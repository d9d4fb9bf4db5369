"""The device runner as it lies on a board, run as a board runs it, and what it reports.

``pushed`` copies exactly the files the calibrator pushes (fixture, one per test module);
``run_runner`` runs it with torch (and any other module named) made to fail, and returns its JSON
events and where every hydra_edge module it imported came from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_edge.measure.session import runner_files

# Blocks torch, runs the runner as __main__, then reports where every hydra_edge module came from.
GUARD = """\
import json, os, runpy, sys
for blocked in ["torch", *os.environ.get("BLOCKED_MODULES", "").split()]:
    sys.modules[blocked] = None
runner, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_path(runner, run_name="__main__")
except SystemExit as e:
    code = e.code
print(json.dumps({"event": "modules", "code": code,
                  "files": [getattr(m, "__file__", "") for n, m in sys.modules.items() if n.startswith("hydra_edge")]}))
"""


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runner and exactly the modules the calibrator pushes, as they lie on a board."""
    root = tmp_path_factory.mktemp("board")
    for rel, local in runner_files("runner").items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, root / rel)
    return root / "runner"


def run_runner(pushed: Path, *args: object, blocked: str = "") -> tuple[list[dict], dict]:
    done = subprocess.run([sys.executable, "-c", GUARD, str(pushed / "calibration" / "runner.py"),
                           *map(str, args)], capture_output=True, text=True, timeout=120, cwd=pushed.parent,
                          env={**os.environ, "BLOCKED_MODULES": blocked})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return events[:-1], events[-1]
