"""What the one-question benchmarks share (``exec_update_cost.py``, ``side_effect_cost.py``).

Each measures one figure a comment or a design choice rests on, writes
``<device>-<name>.json`` and ``.md`` next to the other results, prints the
markdown, and prints the JSON on one line starting ``JSON `` (for runs whose
files do not come back).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from ..harness import provenance, stats

__all__ = ["ROOT", "run_meta", "write_report"]

ROOT = provenance.ROOT


def run_meta(script: str, argv: list[str]) -> dict | None:
    """Date, command, versions, git commit (``JAXGRAPH_GIT`` wins, for a copied tree), device and
    driver; ``None``, after saying so, where jaxgraph finds no CUDA device."""
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print(f"{script} needs a CUDA GPU: none found")
        return None
    versions = provenance.versions(("jax", "jaxlib", "cuda-bindings", "cuda-core", "numpy", "jaxgraph"), python=False)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", script, *argv]), "versions": versions,
            "git": provenance.git_commit(),
            "device": "unknown device", "driver": "?"}
    smi = provenance.nvidia_smi()
    if smi:
        name, _, driver_version = smi.rpartition(",")
        meta["device"], meta["driver"] = name.strip(), driver_version.strip()
    return meta
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
