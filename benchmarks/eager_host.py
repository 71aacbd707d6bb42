"""Host Python work per eager launch, with the driver stubbed out: runs on a machine without a GPU.

    python benchmarks/eager_host.py [--repeats 15] [--calls 20000]

This measures **host Python work only**: the kernel is compiled for sm_90 by
NVRTC but never loaded, the native launch is replaced by a Python no-op, and
the arrays are DeviceArrays at made-up addresses (nothing is dereferenced).
What remains is what jaxgraph does per launch before the driver: argument
checks and packing, the launch configuration, the stream and context lookup.
It guides work on that path; the real figures (driver included, next to
cuda.core's launch) come from ``benchmarks/launch_overhead.py`` on the GPU.

Ways timed, interleaved, ns per launch (the minimum over repeats, the least
disturbed by other work on the machine):

- ``bound_stream``: ``b = kernel[grid, block, 0, s]`` once, then ``b(y, x, n)``;
- ``bound_current``: ``b = kernel[grid, block]`` once (the current stream), then ``b(y, x, n)``;
- ``index_each_call``: ``kernel[grid, block](y, x, n)`` (the current stream);
- ``index_stream``: ``kernel[grid, block, 0, s](y, x, n)``;
- ``launch_kwargs``: ``kernel.launch(y, x, n, grid=..., block=..., stream=s)``;
- ``alternating_kinds``: ``b(y, x, n)`` then ``b(y, x, numpy.int32(n))``, per launch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, SOURCE  # noqa: E402


def stand_ins() -> tuple[Any, Any, Any, Any]:
    """An ``add_one`` kernel compiled for sm_90 (never loaded), a stream and two DeviceArrays at made-up addresses.

    Launched inside ``jaxgraph.diagnostics.launches_without_driver(kernel)``, the
    launches stop before the driver; nothing is dereferenced.
    """
    import jaxgraph
    from jaxgraph import diagnostics

    kernel = jaxgraph.Kernel(SOURCE, "add_one", arch="sm_90")
    stream = diagnostics.stream_at(0x1234, device=0)
    x = diagnostics.device_array_at(0x7000_0000, ELEMENTS, np.float32, device=0)
    y = diagnostics.device_array_at(0x7000_4000, ELEMENTS, np.float32, device=0)
    return kernel, stream, x, y


def ways(kernel: Any, stream: Any, x: Any, y: Any) -> dict[str, Callable[[], None]]:
    bound = kernel[GRID, BLOCK, 0, stream]
    bound_current = kernel[GRID, BLOCK]
    n32 = np.int32(ELEMENTS)

    def alternating() -> None:
        bound(y, x, ELEMENTS)
        bound(y, x, n32)

    return {
        "bound_stream": lambda: bound(y, x, ELEMENTS),
        "bound_current": lambda: bound_current(y, x, ELEMENTS),
        "index_each_call": lambda: kernel[GRID, BLOCK](y, x, ELEMENTS),
        "index_stream": lambda: kernel[GRID, BLOCK, 0, stream](y, x, ELEMENTS),
        "launch_kwargs": lambda: kernel.launch(y, x, ELEMENTS, grid=GRID, block=BLOCK, stream=stream),
        "alternating_kinds": alternating,  # two launches per call: halved below
    }


def time_ways(table: dict[str, Callable[[], None]], repeats: int, calls: int) -> dict[str, float]:
    """Each way's best seconds per call over ``repeats`` interleaved runs of ``calls`` calls."""
    best = {name: float("inf") for name in table}
    for fn in table.values():  # warm-up: the first launch of each kind checks and specializes
        fn()
    for _ in range(repeats):
        for name, fn in table.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    from jaxgraph import diagnostics

    kernel, stream, x, y = stand_ins()
    with diagnostics.launches_without_driver(kernel):  # loaded as far as jaxgraph can tell; no driver call
        best = time_ways(ways(kernel, stream, x, y), args.repeats, args.calls)
    best["alternating_kinds"] /= 2
    print("host Python work per eager launch, native launch stubbed (ns, min of "
          f"{args.repeats} interleaved repeats of {args.calls} calls)")
    for name, seconds in best.items():
        print(f"{name:<18} {seconds * 1e9:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
