"""Does the floor's speed depend on where its buffer lies in device memory?

Run:  python benchmarks/probes/placement_probe.py [--n 100] [--buffers 32] [--rounds 5] [--launches 20]

The harness's floor (``raw``) has run at ~1.03 us per kernel in some processes
and ~1.21 in others, with the GPU's clocks unchanged (``floor_probe.py``). This
captures the workload's chain (N in-place ``add_one`` kernels on 4096 floats,
``benchmarks/harness/workload.py``) once per buffer, on many buffers spread through
device memory by pads of random size between them, and times each executable
with CUDA events in interleaved rounds. Controls: three captures on one buffer
(the executable, not the memory) and a buffer captured again after the rest.
Then the same on buffers JAX allocated, which is where a replay in jit runs.

Prints each buffer's address, us per kernel (median of rounds) and the spread;
a bimodal column with the controls agreeing says the memory decides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.probe_kit import driver_call as call, kit, timed_launches  # noqa: E402
from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, check_result, random_input  # noqa: E402


class RawBuffer:
    """4096 float32 at a raw device address, as a CUDA array interface (for capture only)."""

    def __init__(self, address: int):
        self.address = address
        self.__cuda_array_interface__ = {"shape": (ELEMENTS,), "typestr": "<f4", "data": (address, False),
                                         "version": 3, "strides": None}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--buffers", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launches", type=int, default=20)
    args = p.parse_args()
    import jaxgraph
    from cuda.bindings import driver

    if jaxgraph.device_count() == 0:
        print("placement_probe.py needs a CUDA GPU: none found")
        return 0

    rng = np.random.default_rng()
    probe = kit()
    launch = probe.kernel[GRID, BLOCK]
    keep = []

    def chain_on(buf) -> object:
        g = jaxgraph.CUDAGraph(keep_graph=True)
        with jaxgraph.graph(g):
            for _ in range(args.n):
                launch(buf, buf, ELEMENTS)
        exe = call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0)
        keep.append(g)
        x = random_input(rng)
        call("cuMemcpyHtoD", buf.__cuda_array_interface__["data"][0], x.ctypes.data, x.nbytes)
        call("cuGraphLaunch", exe, probe.handle)
        call("cuStreamSynchronize", probe.handle)
        y = np.empty_like(x)
        call("cuMemcpyDtoH", y.ctypes.data, buf.__cuda_array_interface__["data"][0], y.nbytes)
        check_result(y, x, args.n)
        return exe

    def time_all(execs: dict) -> dict:
        samples = {k: [] for k in execs}
        for _ in range(args.rounds):
            for k, exe in execs.items():
                seconds = timed_launches(probe, [exe], args.launches)
                samples[k].append(seconds * 1e6 / (args.launches * args.n))
        return samples

    def report(tag: str, samples: dict) -> None:
        med = {k: float(np.median(v)) for k, v in samples.items()}
        print(f"--- {tag}: us per kernel, median of {args.rounds} rounds (min-max), sorted")
        for k in sorted(med, key=med.get):
            print(f"  {k}: {med[k]:.4f} ({min(samples[k]):.4f}-{max(samples[k]):.4f})")
        vals = np.array(list(med.values()))
        print(f"  summary: min {vals.min():.4f} max {vals.max():.4f}; "
              f"under 1.10: {(vals < 1.10).sum()}, 1.10 and over: {(vals >= 1.10).sum()}")

    # Raw buffers spread by random pads.
    execs = {}
    for i in range(args.buffers):
        pad = call("cuMemAlloc", int(rng.integers(1, 64)) * 65536 + int(rng.integers(0, 16)) * 4096)
        address = int(call("cuMemAlloc", ELEMENTS * 4))
        keep.append(pad)
        buf = RawBuffer(address)
        execs[f"raw{i:02d} @{address:#x}"] = chain_on(buf)
        if i == 0:
            execs[f"raw00 @{address:#x} capture2"] = chain_on(buf)
            execs[f"raw00 @{address:#x} capture3"] = chain_on(buf)
            first = buf
    execs[f"raw00 @{first.address:#x} capture4 (after the rest)"] = chain_on(first)
    report("cuMemAlloc buffers, no JAX in the process", time_all(execs))

    import jax
    import jax.numpy as jnp

    arrays = [jnp.asarray(random_input(rng)) for _ in range(args.buffers)]
    jax.block_until_ready(arrays)
    xla = {}
    for i, a in enumerate(arrays):
        address = a.unsafe_buffer_pointer()
        xla[f"xla{i:02d} @{address:#x}"] = chain_on(RawBuffer(address))
    report("the same buffers again, JAX started", time_all(execs))
    report("buffers JAX allocated", time_all(xla))
    return 0


if __name__ == "__main__":
    sys.exit(main())
