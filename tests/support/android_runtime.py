"""The APK's own ExecuTorch runtime on this host, for the tests: its parts, and bundles holding programs it refuses.

``shipped_parts()``: the runtime files ``android-app`` packages (fetched once, as the build fetches them).
``spoiled``: programs made from a real one the way a phone could meet them: cut short, garbled, naming a
delegate the runtime does not carry, or another model's program. ``with_program`` puts one in a copy of a
bundle under a head count, the manifest's sha256 and size made to match, so the bundle's checks pass and
only the runtime can refuse it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Callable, Dict

from hydra_edge.android import apk, host_runtime


def shipped_parts() -> host_runtime.Parts:
    """The runtime the APK carries: react-native-executorch's x86_64 library and classes, fbjni, nativeloader."""
    return apk.runtime_parts(apk.executorch_runtime(), {name: apk.maven_part(name) for name in ("fbjni", "nativeloader")})


def truncated(program: bytes) -> bytes:
    """The first 20000 bytes: a copy or download cut short (the header still says the whole size)."""
    return program[:20000]


def garbled(program: bytes) -> bytes:
    """1000 random bytes over the flatbuffer that follows the header: storage or a transfer gone bad."""
    spoiled = bytearray(program)
    rng = random.Random(1)
    for i in range(64, 1064):
        spoiled[i] = rng.randrange(256)
    return bytes(spoiled)


def foreign_delegate(program: bytes) -> bytes:
    """Its XNNPACK delegate renamed to a backend this runtime does not carry (Vulkan), the string's size kept."""
    name = b"XnnpackBackend"
    assert program.count(name) == 1
    return program.replace(name, b"VulkanBackend\0")


SPOILED: Dict[str, Callable[[bytes], bytes]] = {"truncated": truncated, "garbled": garbled,
                                                 "foreign delegate": foreign_delegate}


def with_program(bundle: Path, out: Path, heads: int, program: bytes) -> Path:
    """A copy of full-layout ``bundle`` at ``out`` whose ``heads`` artefact is ``program``, its manifest record's
    sha256 and bytes rewritten to match (so only running it can tell)."""
    shutil.copytree(bundle, out, ignore=shutil.ignore_patterns(".lock", "logs"))
    doc = json.loads((out / "manifest.json").read_text())
    record = next(a for a in doc["artefacts"] if a["heads"] == heads)
    assert record["compact"] is None, "a full-layout bundle: the program is a file of its own"
    (out / record["file"]).write_bytes(program)
    record["sha256"], record["bytes"] = hashlib.sha256(program).hexdigest(), len(program)
    (out / "manifest.json").write_text(json.dumps(doc, indent=1))
    return out
