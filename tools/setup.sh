#!/usr/bin/env bash
# Idempotent machine set-up for the pipeline and its tests: system packages, the project venv,
# a running Docker engine and the embedded registry. Safe to run again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# chromium: the catalog's browser test (headless). pigz: dockerd unpacks pulled layers with
# unpigz when it is on PATH (a CUDA image's layers from the registry cache: 64 s → 50 s here).
for pkg in docker.io docker-registry mmdebstrap skopeo apache2-utils chromium pigz; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The project venv has no system site-packages, so an import that pyproject.toml does not
# declare fails here too instead of working by accident on a hand-prepared machine.
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
# From the hash-pinned lock only (tools/lock_tools.py writes it): the tool that vouches for
# hash-pinned images is not built from whatever the index serves today.
echo "setup: installing the project into .venv from requirements.lock (--require-hashes)"
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
  -r requirements.lock
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  -e .

# A CPU torch venv for the smoke suite's own tests (runs python -m smoke without Docker).
if ! .venv-smoke/bin/python -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "setup: creating .venv-smoke (CPU torch for the smoke-suite tests)"
  python3 -m venv --clear .venv-smoke
  .venv-smoke/bin/pip install -q --disable-pip-version-check torch==2.13.0 numpy
fi

# Debian's client (20.10) drives BuildKit without buildx; the engine must be running.
if ! /usr/bin/docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  setsid /usr/sbin/dockerd >/tmp/dockerd.log 2>&1 </dev/null &
  for _ in $(seq 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 1; done
  /usr/bin/docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start:"; tail -20 /tmp/dockerd.log; exit 1; }
fi

# Exit 2 when the address answers with a registry this checkout did not start (it names whose).
if ! .venv/bin/python -m builder registry start; then
  echo "setup: NOT ready: the registry address is held by something this checkout did not start" \
    "(above); follow the hint, then run tools/setup.sh again" >&2
  exit 2
fi
echo "setup: ready — run .venv/bin/nox -s build (main job) or .venv/bin/nox -s lint tests"
