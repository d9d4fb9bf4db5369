#!/usr/bin/env bash
# Install hydra-edge into ./.venv on a fresh machine (Python 3.11, pip, gcc). Safe to re-run: it
# skips what is already done. torch 2.13.0 goes in FIRST: executorch and litert-torch would otherwise
# resolve a newer torch they were not built against (see docs/dependencies.md). From PyPI, 2.13.0 on
# x86_64 is the CUDA build (about 2.7 GB of nvidia-* wheels), which runs on a CPU; set TORCH_INDEX_URL
# to PyTorch's CPU index where it can be reached for the 200 MB CPU build instead.
set -euo pipefail
cd "$(dirname "$0")"

# Device stand-ins the tests drive with real clients (OpenSSH's sshd, Debian's adb), the
# compilers that check the emitted lookup tables (gcc is there; kotlinc and a JDK may not be), and
# the headless browser that opens the board's live page.
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
command -v adb >/dev/null 2>&1 || need+=(adb)
command -v kotlinc >/dev/null 2>&1 || need+=(kotlin)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# The Android demo app is built without the Android SDK: Debian's aapt, zipalign, apksigner and
# framework-res.apk (hydra-edge android-app, docs/android.md); npm fetches the ExecuTorch runtime.
for tool in aapt zipalign apksigner; do command -v $tool >/dev/null 2>&1 || need+=($tool); done
[ -f /usr/share/android-framework-res/framework-res.apk ] || need+=(android-framework-res)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "install.sh: missing ${need[*]}; run: sudo apt-get install ${need[*]}" >&2
  fi
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.hydra-edge-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # setuptools as pyproject's [build-system] asks: tests build the wheel offline with it (tests/test_package.py).
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77"
  .venv/bin/python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv/bin/python -m pip install -q -e ".[test,bench]"
  echo "$want" > "$stamp"
fi

# The Android switcher library (apps/android-demo/core) builds with Maven: fetch its plugins and
# dependencies once, tests included (surefire's JUnit provider is fetched only when tests run), so
# tests/test_android_parity.py builds it offline (-o). Done again only when pom.xml changes.
command -v mvn >/dev/null 2>&1 || { [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null; } \
  || echo "install.sh: missing maven; run: sudo apt-get install maven" >&2
core_pom=apps/android-demo/core/pom.xml
core_stamp="$HOME/.m2/repository/.hydra-edge-core-$(sha256sum "$core_pom" | cut -c1-16)"
if command -v mvn >/dev/null 2>&1 && [ ! -e "$core_stamp" ]; then
  mvn -q -B -f "$core_pom" package dependency:go-offline >/dev/null && touch "$core_stamp"
fi

# The Android demo app's build parts (hydra-edge android-app): Maven Central jars into ~/.m2, the
# ExecuTorch runtime (react-native-executorch's prebuilt JNI library) into the user's cache folder.
# Fetched once; a failure here only means android-app fetches them itself later.
if command -v mvn >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && [ -x .venv/bin/python ]; then
  .venv/bin/python -c "from hydra_edge.android import apk; [apk.maven_part(n) for n in apk.MAVEN]; apk.executorch_runtime()" \
    || echo "install.sh: could not pre-fetch the Android app's build parts; hydra-edge android-app will try again" >&2
fi
