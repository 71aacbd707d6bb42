#!/usr/bin/env bash
# The declared version floors, proved: in a fresh virtual environment, install
# every lower bound that pyproject.toml declares (the runtime dependencies and
# the test extra, each pinned with "=="), build jaxgraph there with the build
# requirements' floors (scikit-build-core, nanobind), and run the CPU suite.
#
#   bash tests/floors.sh                          # with python3
#   FLOORS_PYTHON=python3.10 bash tests/floors.sh # the oldest Python supported
#
# It needs a package registry and downloads a few hundred MB, so .ci/run does
# not run it: run it whenever a floor in pyproject.toml changes, and record the
# result in BUILD.md ("Version floors"). Exit status: the suite's.
set -euo pipefail
cd "$(dirname "$0")/.."

py="${FLOORS_PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/jaxgraph-floors.XXXXXX")"

# The floors, read from pyproject.toml by a Python that has tomllib (3.11+).
python3 - "$work" <<'EOF'
import pathlib, re, sys, tomllib

work = pathlib.Path(sys.argv[1])
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())


def floors(requirements, skip=()):
    """Each requirement's ">=" bound as "name==bound" (markers and other bounds dropped)."""
    pins = []
    for req in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        low = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", req.split(";")[0])
        if name not in skip and low:
            pins.append(f"{name}=={low.group(1)}")
    return pins


runtime = floors(project["project"]["dependencies"] + project["project"]["optional-dependencies"]["test"])
# The build's own floors. jaxlib is pinned there already (its FFI headers), and
# NVIDIA's runtime/crt wheels are pinned to the 13.0 series.
build = floors(project["build-system"]["requires"], skip=("jaxlib",))
(work / "runtime.txt").write_text("\n".join(runtime) + "\n")
(work / "build.txt").write_text("\n".join(build) + "\n")
print("floors: runtime " + " ".join(runtime))
print("floors: build   " + " ".join(build))
EOF

"$py" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
echo "floors: $(python --version) in $work/venv"

# PIP_CONSTRAINT reaches pip's isolated build environment too (the build
# floors); -c pins the runtime floors in the install itself.
PIP_CONSTRAINT="$work/build.txt" python -m pip install -q -c "$work/runtime.txt" -e ".[test]"
echo "floors: installed"
python -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|numpy|cuda-bindings|cuda-core|nvidia-cuda-nvrtc|nvidia-cuda-runtime|pytest|scikit-build-core|scikit_build_core) '
python - "$work/runtime.txt" <<'EOF'
import sys
from importlib.metadata import version

wrong = []
for line in open(sys.argv[1]).read().split():
    name, want = line.split("==")
    have = version(name)
    if have != want and not have.startswith(want + "."):
        wrong.append(f"{name} {have} (floor {want})")
if wrong:
    sys.exit("floors: not the declared floors: " + ", ".join(wrong))
print("floors: every runtime floor is the installed version")
EOF

set +e  # report the suite's result and skips even when it fails
python -m pytest -q -p no:cacheprovider -rs 2>&1 | tee "$work/pytest.log" | grep -v '^SKIPPED' | tail -25
status=${PIPESTATUS[0]}
set -e
# "SKIPPED [count] file:line: reason" lines, summed per reason.
echo "floors: skipped, by reason:"
sed -nE 's/^SKIPPED \[([0-9]+)\] [^ ]+: (.*)$/\1\t\2/p' "$work/pytest.log" \
  | awk -F'\t' '{n[$2] += $1} END {for (r in n) printf "  %4d  %s\n", n[r], r}' | sort -rn
echo "floors: pytest exit status $status (log: $work/pytest.log)"
exit "$status"
