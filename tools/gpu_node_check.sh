#!/usr/bin/env bash
# The first run on a real GPU node: `torch-smoke --require-gpu --json` in the CUDA slim and
# runtime images, then one table of every check and what CUDA used.
#
#   tools/gpu_node_check.sh [IMAGE ...]
#
# IMAGE: image references the engine has (pulled by digest, or built here). Without any, the
# matrix's 2.15.0 py3.11 CUDA slim and runtime images of this machine's platform are asked from
# `python -m builder plan` (they must have been built or pulled). Without Docker, set
# SMOKE_PYTHON=/path/to/python (a Python with a CUDA torch) to run the suite from this checkout
# against the slim lock's facts instead.
#
# Environment: OUT (reports folder, default ./gpu-node-check), GPUS (docker's --gpus, default
# all), SMOKE_TIMEOUT (seconds per image, default 1800).
# Exit status: 0 every image passed, 1 one failed, 2 the check could not run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$PWD/gpu-node-check}"
GPUS="${GPUS:-all}"
SMOKE_TIMEOUT="${SMOKE_TIMEOUT:-1800}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"

default_images() {
  local arch platform
  arch="$(uname -m)"
  platform="linux/amd64"
  if [ "$arch" = "aarch64" ] || [ "$arch" = "arm64" ]; then platform="linux/arm64"; fi
  (cd "$ROOT" && "$PYTHON" -m builder plan --json --select torch=2.15.0 --select python=3.11 \
      --select accelerator=cuda --select flavor=slim --select flavor=runtime \
      --select "platform=$platform") | "$PYTHON" -c \
    'import json, sys; print("\n".join(i["image"] for i in json.load(sys.stdin)["include"]))'
}

run_image() {  # IMAGE REPORT: the suite in the image, its JSON report on stdout
  local rc=0
  timeout "$SMOKE_TIMEOUT" docker run --rm --gpus "$GPUS" --shm-size=8g --network none \
    "$1" torch-smoke --require-gpu --json >"$2" 2>"$2.log" || rc=$?
  echo "$1: torch-smoke exited with $rc (report $2, log $2.log)" >&2
}

run_checkout() {  # REPORT: the suite from this checkout with SMOKE_PYTHON
  local rc=0
  (cd "$ROOT" && timeout "$SMOKE_TIMEOUT" "$SMOKE_PYTHON" -m smoke --require-gpu \
      --facts locks/2.15.0-py3.11-cuda-slim.json --json -) >"$1" 2>"$1.log" || rc=$?
  echo "checkout with $SMOKE_PYTHON: the suite exited with $rc (report $1)" >&2
}

reports=()
if [ -n "${SMOKE_PYTHON:-}" ]; then
  report="$OUT/checkout.json"
  run_checkout "$report"
  reports+=("$report")
else
  command -v docker >/dev/null || { echo "error: no docker (or set SMOKE_PYTHON)" >&2; exit 2; }
  images=("$@")
  if [ "${#images[@]}" -eq 0 ]; then
    mapfile -t images < <(default_images)
  fi
  [ "${#images[@]}" -gt 0 ] || { echo "error: no images to check" >&2; exit 2; }
  for image in "${images[@]}"; do
    report="$OUT/$(printf '%s' "$image" | tr -c 'A-Za-z0-9._-' '_').json"
    run_image "$image" "$report"
    reports+=("$report")
  done
fi

# One table: the checks of every report, then the devices CUDA used and the driver.
(cd "$ROOT" && "$PYTHON" - "${reports[@]}") <<'PY'
import json
import sys

from smoke.host import host_summary

worst = 0
rows = [("image", "check", "status", "message")]
hosts = []
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as exc:
        rows.append((path, "-", "no report", str(exc)[:100]))
        worst = max(worst, 2)
        continue
    image = (report.get("image") or {}).get("ref") or path.rsplit("/", 1)[-1]
    for check in report.get("checks", []):
        status = check["status"] + (f" (was {check['original_status']})"
                                    if "original_status" in check else "")
        rows.append((image, check["name"], status, check.get("message", "")[:100]))
    hosts.append(f"{image}: {report['status'].upper()}: {host_summary(report.get('host') or {})}")
    worst = max(worst, 0 if report["status"] == "pass" else 1)
widths = [max(len(r[i]) for r in rows) for i in range(3)]
for r in rows:
    print(f"| {r[0]:<{widths[0]}} | {r[1]:<{widths[1]}} | {r[2]:<{widths[2]}} | {r[3]} |")
print()
print("\n".join(hosts))
sys.exit(worst)
PY
