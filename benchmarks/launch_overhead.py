"""Host cost of one eager kernel launch: jaxgraph vs PyTorch eager vs cuda.core.

Run:  python benchmarks/launch_overhead.py

A thin front over the harness: the four ways of ``benchmarks/harness/extras.py``
(also measured by ``benchmarks/run.py`` in its no-JAX process) launch the same
tiny kernel (y = x + 1 on 4096 floats) back to back, each checked against
numpy first; the figure is host wall time per launch on a warm queue, median
of interleaved repeats.
"""

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import extras, stats, timing  # noqa: E402
from benchmarks.harness.config import SCALAR_INFO  # noqa: E402
from benchmarks.harness.workload import SOURCE  # noqa: E402

REPEATS, TARGET_S, MAX_CALLS = 15, 0.02, 20_000


def main() -> int:
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("eager launches need a CUDA GPU: none found")
        return 0
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    stream = jaxgraph.Stream()
    factories = extras.eager_factories(kernel, stream, np.random.default_rng())
    records = timing.measure_group("[eager]", factories, REPEATS, TARGET_S, MAX_CALLS)
    rows = {SCALAR_INFO[key]: record for key, record in records.items()}
    width = max(map(len, rows))
    print(f"\n{'way of launching':<{width}}  us per launch (median of {REPEATS} interleaved repeats)")
    for label, record in rows.items():
        if record.get("samples"):
            print(f"{label:<{width}}  {stats.summarize(record['samples'])['median']:6.2f}")
        else:
            print(f"{label:<{width}}  {record.get('skipped') or record.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
