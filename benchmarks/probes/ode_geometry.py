"""Which geometry suits ``examples/adaptive_ode.py``'s one-kernel step (``tile_step``) at each N?

Run:  python benchmarks/probes/ode_geometry.py [--sizes 40,2000,20000] [--geometries 256x2,128x4] [--repeats 5]

One process under its ``XLA_FLAGS`` (set them to compare settings). For each
N, the default geometry (``adaptive_ode.tile_geometry``), each
``THREADSxPER_THREAD`` of ``--geometries`` (one block when it holds the ring,
else tiles) and the six-kernel ``stages`` path: the device loop in
``jax.jit`` (``jax_solve``) and the same kernels through ``Kernel.jax_call``
in a ``lax.while_loop`` (``xla_solve``), Lorenz-96 on [0, t_end], rtol = atol
= 1e-5. Each is checked first (t_end reached, the two bit for bit the same,
the default geometry's step counts); printed: ms per solve, median and range
of ``--repeats`` timed solves, and us per attempted step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import example_loader  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="40,100,2000,4096,20000,65536", help="comma-separated N")
    p.add_argument("--geometries", default="32x1,64x1,128x1,256x1,128x2,256x2,512x2",
                   help="THREADSxPER_THREAD, comma-separated (one block where it holds the ring)")
    p.add_argument("--t-end", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.geometries = [tuple(int(x) for x in g.split("x")) for g in args.geometries.split(",") if g]
    return args


def timed(fn, repeats):
    """Median, min and max seconds of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times), max(times)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("ode_geometry.py needs a CUDA GPU: none found")
        return 0
    import jax

    jax.config.update("jax_enable_x64", True)
    ao = example_loader.load("adaptive_ode")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}; {jax.devices()[0].device_kind}; t in [0, {args.t_end}]")
    rows = []
    for n in args.sizes:
        y0 = jax.numpy.asarray(ao.initial_state(n, np.random.default_rng(args.seed + n)))
        configs = [("default", {})]
        for block, per_thread in args.geometries:
            if block * per_thread >= n and (block - 32) * per_thread >= n:
                continue  # one block with a warp or more idle: the default is that block, smaller
            configs.append((f"{block}x{per_thread}", dict(block=block, per_thread=per_thread)))
        configs.append(("stages", dict(path="stages")))
        want = None
        for label, kw in configs:
            ode = ao.AdaptiveDopri5(n, args.t_end, **kw)
            loop, xla = jax.jit(ode.jax_solve), jax.jit(ode.xla_solve)
            a, b = ([np.asarray(v) for v in f(y0)] for f in (loop, xla))
            steps = (int(a[2]), int(a[3]))
            if float(a[1]) != args.t_end or not all(np.array_equal(u, v) for u, v in zip(a, b)):
                raise AssertionError(f"N = {n} {label}: t {float(a[1])} / {float(b[1])}, or loop != jax_call")
            want = want or steps
            if abs(steps[0] - want[0]) + abs(steps[1] - want[1]) > 2:
                raise AssertionError(f"N = {n} {label}: steps {steps}, the default geometry's {want}")
            t_loop, t_xla = timed(lambda: loop(y0), args.repeats), timed(lambda: xla(y0), args.repeats)
            per = sum(steps)
            row = {"n": n, "config": label, "geometry": repr(ode), "steps": steps, "loop_ms": t_loop,
                   "xla_ms": t_xla}
            rows.append(row)
            print(f"N={n:>6} {label:>8} ({ode.blocks:>3} blocks): loop {t_loop[0] * 1e3:7.3f} ms "
                  f"[{t_loop[1] * 1e3:.3f}-{t_loop[2] * 1e3:.3f}] {t_loop[0] / per * 1e6:6.2f} us/step | jax_call "
                  f"{t_xla[0] * 1e3:7.3f} ms [{t_xla[1] * 1e3:.3f}-{t_xla[2] * 1e3:.3f}] "
                  f"{t_xla[0] / per * 1e6:6.2f} us/step | x{t_xla[0] / t_loop[0]:.2f} | steps {steps}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
