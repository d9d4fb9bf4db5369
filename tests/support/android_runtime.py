"""The APK's own ExecuTorch runtime on this host, for the tests: its parts, bundles holding programs it refuses,
and the app's classes built to run beside it.

``shipped_parts()``: the runtime files ``android-app`` packages (fetched once, as the build fetches them).
``SPOILED``: programs made from a real one the way a phone could meet them: cut short, garbled, naming a
delegate the runtime does not carry; ``other_model_program()`` is another model's. ``with_program`` puts one
in a copy of a bundle under a head count, the manifest's sha256 and size made to match, so the bundle's checks
pass and only the runtime can refuse it. ``phone_table``: a lut.json for a bundle from a made-up calibration.
``app_classpath``: the app's Java (apps/android-demo/app) and the host drivers in ``android_app/`` compiled
against Android's framework classes, and what runs them beside the runtime (the switcher library, org.json);
the framework itself is left off that classpath, so a class that touches it at run time fails.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List

import msgspec

from hydra_edge.android import apk, host_runtime
from hydra_edge.atomic import sha256_file
from hydra_edge.lut.policy import Policy, ThermalPolicy
from hydra_edge.lut.table import build_table
from hydra_edge.records.calibration import Calibration, HeadResult
from hydra_edge.records.manifest import Manifest, read_manifest

DRIVERS = Path(__file__).resolve().parent / "android_app"


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


def other_model_program() -> bytes:
    """Another model's program: a small convolutional net on 3x32x32 images, lowered to XNNPACK by executorch as
    convert lowers a HydraViT, so it loads in the runtime but takes no digits image."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 30 * 30, 5)).eval()
    exported = torch.export.export(model, (torch.zeros(1, 3, 32, 32),))
    return bytes(to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)


def phone_table(bundle: Path, out: Path, budget_ms: float, latencies_ms: tuple[float, ...] = (5.0, 20.0),
                thermal: ThermalPolicy | None = None) -> Path:
    """lut.json for ``bundle`` from a made-up calibration (``latencies_ms``, a head count each): the table needs
    latencies, not a phone. A budget over the largest lets a cool phone run the most heads; ``thermal``: the
    policy's thermal part (default: the policy's own)."""
    manifest = read_manifest(bundle)
    cal = Calibration(device_id="local:test", device={}, settings={}, soak=None,
                      bundle={"path": str(bundle), "manifest_sha256": sha256_file(bundle / "manifest.json"),
                              "target": "android"})
    for a, ms in zip(manifest.artefacts, latencies_ms):
        cal.put(HeadResult(heads=a.heads, artefact=a.id, sha256=a.sha256, status="ok", runner="python",
                           latency={"count": 10, "p50_ms": ms, "mean_ms": ms}))
    cal.write(out.parent / "cal.json")
    doc = build_table(bundle, Manifest.from_dict(json.loads((bundle / "manifest.json").read_text())), cal,
                      out.parent / "cal.json", msgspec.structs.replace(Policy(), budget_ms=budget_ms,
                                                                     thermal=thermal or Policy().thermal))
    out.write_text(json.dumps(doc))
    return out


def app_classpath(runtime: host_runtime.HostRuntime, out: Path) -> List[Path]:
    """The app's classes and the host drivers, compiled into ``out``, then the switcher library and org.json:
    the classpath the drivers run with beside ``runtime`` (whose own classes the launcher adds)."""
    core = apk.core_jars()  # the library's jar and kotlin-stdlib (mvn package)
    json_jar = [Path(p) for p in (apk.APP / "core" / "target" / "classpath.txt").read_text().strip().split(":")
                if Path(p).name.startswith("json-")]
    sources = sorted(str(p) for p in [*(apk.APP / "app" / "src" / "main" / "java").rglob("*.java"),
                                      *DRIVERS.rglob("*.java"), *(host_runtime.HOST / "java").rglob("*.java")])
    compile_path = [apk.maven_part("android-all"), *runtime.jars, *core, *json_jar]
    subprocess.run(["javac", "--release", "8", "-Xlint:-options", "-nowarn", "-encoding", "UTF-8", "-d", str(out),
                    "-cp", ":".join(map(str, compile_path)), *sources], check=True, capture_output=True, text=True)
    return [out, *core, *json_jar]
