#!/usr/bin/env bash
# Install jaxgraph on the GPU machine (no package registry there: everything it
# needs is preinstalled) and run the whole suite; write a summary.
#
#   bash tests/gpu_check.sh [extra pytest args]
#
# Writes $OUT (or /tmp/jaxgraph-gpu) /summary.txt, pytest.log, junit.xml, env.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-/tmp/jaxgraph-gpu}
mkdir -p "$dest"
export PYTHONUNBUFFERED=1

{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 - <<'PY'
import importlib.metadata as md, platform
names = ["jax", "jaxlib", "jax-cuda13-plugin", "cuda-bindings", "cuda-core", "cuda-pathfinder",
         "nvidia-cuda-nvrtc", "numpy", "torch", "cupy-cuda13x", "nanobind", "scikit-build-core", "pytest"]
versions = []
for n in names:
    try:
        versions.append(f"{n} {md.version(n)}")
    except md.PackageNotFoundError:
        versions.append(f"{n} -")
print("python", platform.python_version(), "|", ", ".join(versions))
PY
} > "$dest/env.txt" 2>&1
cat "$dest/env.txt"

# -v: the log shows CMake's line saying where CUDA came from (BUILD.md).
if ! python3 -m pip install -v --no-build-isolation --no-deps -e . > "$dest/install.log" 2>&1; then
  tail -40 "$dest/install.log"
  echo "install failed" | tee "$dest/summary.txt"
  exit 1
fi
grep -o "jaxgraph: CUDA .*" "$dest/install.log" | tee -a "$dest/env.txt"
python3 examples/quickstart.py 2>&1 | tee "$dest/quickstart.log"

# No CUDA device here is a failure, not a run of skipped GPU tests (tests/conftest.py).
export JAXGRAPH_REQUIRE_GPU=1
python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$dest/junit.xml" "$@" 2>&1 | tee "$dest/pytest.log"
status=${PIPESTATUS[0]}
{
  cat "$dest/env.txt"
  echo "command: bash tests/gpu_check.sh $*"
  grep -E "^(FAILED|ERROR)" "$dest/pytest.log" || true
  python3 - "$dest/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
total, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"counts: {total - failed - errors - skipped} passed, {failed} failed, {errors} errors, "
      f"{skipped} skipped, in {float(suite.get('time', 0)):.1f} s")
PY
} > "$dest/summary.txt"
echo "pytest exit status: $status"
exit "$status"
