"""Which ``Kernel.jax_call`` loops in XLA's ``lax.while_loop`` end: a probe of the CG hang seen on an H200.

Run:  python benchmarks/probes/xla_while_probe.py [--n 64] [--max-iter 5] [--timeout 40]

On jax 0.11.2 on an H200 (2026-11-28, ``tests/GPU_RESULTS.md``), the ``cg_fused`` kernel of
``examples/poisson_solver.py`` through ``jax_call`` in a jitted ``lax.while_loop`` (one launch a
trip, ``Kernels.xla_cg``) never ended, at JAX's defaults and with command buffers off, even with
``max_iter`` 1, while one such call outside a loop counted and wrote as it should and the Jacobi
kernel's loop of the same form ended. The CG call passes ``x, p, flag, count`` in place
(``inout``) at operand and result positions 0-3, the loop carrying them at the same positions; the
Jacobi call's in-place ``flag, count`` are operands 0-1 but results 2-3.

Each variant runs in its own process with a time limit and prints whether it ended, the count it
returned and its wall time:

- ``jacobi``: ``Kernels.xla_jacobi`` (the control: ended on the H200);
- ``cg``: ``Kernels.xla_cg`` as the example writes it (one launch a trip);
- ``cg_4``: four launches a trip (ended at n = 64 and 128 in ``vs_idiomatic.py`` before the merge);
- ``cg_touched``: one launch a trip, the loop carrying ``flag + 0`` and ``count + 0`` (an XLA op
  between the call's aliased outputs and the loop's state);
- ``cg_distinct``: one launch a trip, the initial ``x, p, s`` and ``flag, count`` distinct arrays
  (``jnp.zeros`` each, as the working single call had) instead of shared constants.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("jacobi", "cg", "cg_4", "cg_touched", "cg_distinct")

WORKER = r'''
import sys
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
import poisson_solver as ps
from poisson_kernels import THREADS

variant, n, max_iter = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prob = ps.Problem(n, 1e-5, np.random.default_rng(0))
k = ps.Kernels(prob, 2)
if variant == "jacobi":
    _, count = k.xla_jacobi(max_iter, 1)(jnp.asarray(prob.f))
elif variant in ("cg", "cg_4"):
    _, count = k.xla_cg(max_iter, ps.jnp_operator, 4 if variant == "cg_4" else 1)(jnp.asarray(prob.b))
else:
    f32 = jax.ShapeDtypeStruct((n, n), jnp.float32)
    part, two = jax.ShapeDtypeStruct((2 * prob.blocks,), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.float32)

    def solve(b):
        def body(state):
            x, p_dir, flag, count, *rest = state
            x, p_dir, flag, count, *rest = k.cg.jax_call(
                x, p_dir, flag, count, f32, f32, f32, part, two, *rest, prob.n, prob.cg_tol2, grid=prob.blocks,
                block=THREADS, inout=("x", "p", "flag", "count"))
            if variant == "cg_touched":
                flag, count = flag + 0, count + 0
            return (x, p_dir, flag, count, *rest)

        w = ps.jnp_operator(b)
        zeros = (lambda: jnp.zeros_like(b) + 0) if variant == "cg_distinct" else (lambda: jnp.zeros_like(b))
        ints = (lambda: jnp.zeros(1, jnp.int32) + 0) if variant == "cg_distinct" else (lambda: jnp.zeros(1, jnp.int32))
        sums = jnp.zeros(2 * prob.blocks, jnp.float32).at[0].set(jnp.sum(b * b)).at[prob.blocks].set(jnp.sum(w * b))
        init = (zeros(), zeros() * 1, ints(), ints() * 1, b, w, zeros() * 2, sums, jnp.array([jnp.inf, 1], jnp.float32))
        x, _, _, count, *_ = jax.lax.while_loop(lambda s: (s[2][0] == 0) & (s[3][0] < max_iter), body, init)
        return x, count[0]

    _, count = jax.jit(solve)(jnp.asarray(prob.b))
print("COUNT", int(np.asarray(count).reshape(-1)[0]))
'''


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="grid side (default 64)")
    p.add_argument("--max-iter", type=int, default=5, help="the loops' iteration cap (default 5)")
    p.add_argument("--timeout", type=float, default=40.0, help="seconds a variant may take (default 40)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    args = p.parse_args(argv)
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("xla_while_probe.py needs a CUDA GPU: none found")
        return 0
    print(f"jax_call loops in lax.while_loop, n = {args.n}, max_iter = {args.max_iter}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')!r}")
    for variant in args.variants.split(","):
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", WORKER, str(ROOT / "examples"), variant, str(args.n),
                                   str(args.max_iter)], capture_output=True, text=True, timeout=args.timeout,
                                  env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
        except subprocess.TimeoutExpired:
            print(f"{variant:>12}: did not end within {args.timeout:.0f} s")
            continue
        took = time.perf_counter() - start
        counts = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("COUNT ")]
        if proc.returncode != 0 or not counts:
            print(f"{variant:>12}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{variant:>12}: ended, count {counts[0]}, {took:.1f} s with the process's start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
