"""What the one-question benchmarks share (``exec_update_cost.py``, ``side_effect_cost.py``).

Each measures one figure a comment or a design choice rests on, writes
``<device>-<name>.json`` and ``.md`` next to the other results, prints the
markdown, and prints the JSON on one line starting ``JSON `` (for runs whose
files do not come back).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

from . import stats

__all__ = ["ROOT", "run_meta", "write_report"]

ROOT = Path(__file__).resolve().parents[1]


def run_meta(script: str, argv: list[str]) -> dict | None:
    """Date, command, versions, git commit (``JAXGRAPH_GIT`` wins, for a copied tree), device and
    driver; ``None``, after saying so, where jaxgraph finds no CUDA device."""
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print(f"{script} needs a CUDA GPU: none found")
        return None
    versions = {}
    for dist in ("jax", "jaxlib", "cuda-bindings", "cuda-core", "numpy", "jaxgraph"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", script, *argv]), "versions": versions,
            "git": os.environ.get("JAXGRAPH_GIT") or _run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"]),
            "device": "unknown device", "driver": "?"}
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        name, _, driver_version = smi.splitlines()[0].rpartition(",")
        meta["device"], meta["driver"] = name.strip(), driver_version.strip()
    return meta


def _run(cmd: list[str]) -> str | None:
    """A command's stripped stdout, or ``None`` when it is missing or fails."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_report(results: dict, text: str, out_dir: Path, name: str) -> Path:
    """Write ``<device>-<name>.json`` and ``.md`` in ``out_dir``, print the markdown and the JSON line."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{stats.device_slug(results['device'])}-{name}"
    data = stats.json_ready(results)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    print("JSON " + json.dumps(data))
    return stem
