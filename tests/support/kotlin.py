"""The Android demo's Kotlin library (apps/android-demo/core), built once per test module with Maven.

The parity tests replay traces through it and the rebuild tests run its rebuild on compact bundles;
both need the jar and its classpath, which the ``classpath`` fixture builds (its JUnit tests run too).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "apps" / "android-demo" / "core"


@pytest.fixture(scope="module")
def classpath() -> str:
    """Build the library (its JUnit tests run too) and return the classpath that runs TraceReplay."""
    mvn = shutil.which("mvn")
    assert mvn, "mvn missing: the Android library is built with Maven 3.8+ and a JDK 17 (see docs/android.md)"
    assert shutil.which("java"), "java missing: a JDK 17 runs the Android library's tests (see docs/android.md)"
    offline = ["-o"] if (Path.home() / ".m2/repository/org/jetbrains/kotlin/kotlin-maven-plugin").is_dir() else []
    done = subprocess.run([mvn, "-q", "-B", *offline, "-f", str(CORE / "pom.xml"), "package"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"mvn package failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    jar = CORE / "target" / "hydra-edge-core-0.1.0.jar"
    return f"{jar}:{(CORE / 'target' / 'classpath.txt').read_text().strip()}"
