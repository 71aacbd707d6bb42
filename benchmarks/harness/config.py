"""What the benchmark runs: processes and their XLA flags, chain lengths, budgets, modes.

Nothing here touches a GPU; the driver (``run.py``), the workers
(``worker.py``) and the report (``run_report.py``) all read these tables.
"""

from __future__ import annotations

import dataclasses

from jaxgraph.compare.settings import SETTINGS as XLA_SETTINGS

__all__ = [
    "COUNTERS", "DEFAULT_SETTINGS", "FLOOR", "FULL", "JAX_MODES", "LOOPS", "LOOP_CHECK_EVERY", "LOOP_JAX_MODES",
    "LOOP_NOJAX_MODES", "LOOP_UNROLLS", "MIXED_MODES", "MIXED_REPLAYS", "MODE_INFO", "NOJAX_MODES", "QUICK",
    "SCALAR_INFO", "SETTINGS",
    "RunConfig", "Setting", "fori_trips",
]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One worker process: whether it uses JAX and the exact ``XLA_FLAGS`` it gets."""

    key: str
    uses_jax: bool
    xla_flags: str | None  # None: XLA_FLAGS removed from the environment (JAX's defaults)
    label: str


# One process per XLA flag setting: XLA reads XLA_FLAGS once, when its backend starts. The JAX
# settings' flags are jaxgraph.compare's (one definition for the benchmarks and the users' tool).
SETTINGS = {
    "nojax": Setting("nojax", False, None, "no JAX: raw floor, g.replay(), torch, capture, eager launch"),
    **{key: Setting(key, True, _xla.xla_flags, _xla.label) for key, _xla in XLA_SETTINGS.items()},
}
DEFAULT_SETTINGS = ("nojax", "off", "on", "defaults")  # a plain run; --loops adds "while"

FLOOR = "raw"  # every process measures it; ratios are to the floor of the same process

NOJAX_MODES = ("raw", "replay", "torch_cupy", "torch_add")
# Replays between XLA ops, and the same program with the kernels as jax_calls (fixed and rotating inputs).
MIXED_MODES = ("mixed", "mixed_changing", "mixed_calls", "mixed_calls_changing")
JAX_MODES = ("raw", "jit_loop", "jit_changing", "jit_fori", "jit_unrolled", "jax_calls", "trivial_jit", *MIXED_MODES)

# The replay handler's counters (jaxgraph.diagnostics.counters()) each JAX mode reports per call:
# calls per replay path, executables made, kernel-node rebinds, buffer copies, buffers switched to
# copying by their cost, handler calls and host time.
COUNTERS = ("handler_calls", "launch", "splice_nodes", "splice_whole", "uncaptured_launch", "instantiate",
            "rebind", "copy", "to_copy", "handler_ns")

# --loops: R = fori_trips(N) steps of the N-kernel chain, each step's output the next one's input.
LOOP_UNROLLS = (2, 8, 32)
LOOP_CHECK_EVERY = (8, 16, 32)  # until= with check_every=K: the flag tested once per K steps
LOOP_NOJAX_MODES = ("raw", *(f"loop_k{k}" for k in LOOP_UNROLLS), "loop_kdefault", "loop_until", "loop_until_k1",
                    *(f"loop_until_k{k}" for k in LOOP_CHECK_EVERY), "loop_copy", "loop_unrolled")
# The idiomatic JAX programs first: what a user writes without jaxgraph.
LOOP_JAX_MODES = ("raw", "jnp_fori", "jnp_while", "loop_jit", "loop_jit_until",
                  *(f"loop_jit_until_k{k}" for k in LOOP_CHECK_EVERY[:1]), "jit_fori", "xla_fori", "xla_while")

MODE_INFO = {
    "raw": "`cuGraphLaunch` of the jaxgraph graph from cuda.bindings in a Python loop (the floor)",
    "replay": "`g.replay()` in a Python loop on a jaxgraph stream",
    "torch_cupy": "`torch.cuda.CUDAGraph` of the same source via `cupy.RawKernel`, `replay()` in a loop",
    "torch_add": "`torch.cuda.CUDAGraph` of N `torch.add(x, 1, out=y)`, `replay()` in a loop",
    "jit_loop": "`jax.jit(replayable)` called from a Python loop on one fixed input",
    "jit_changing": "as jit_loop, rotating over 8 input arrays (a new input address every call)",
    "jit_fori": "R = 10000/N (10 to 1000) replays in one jitted `lax.fori_loop`, each output the next input",
    "jit_unrolled": "10 replays unrolled in one jit, called from a Python loop",
    "jax_calls": "the chain as N `Kernel.jax_call`s in one jit, called from a Python loop",
    "trivial_jit": "`jax.jit(lambda x: x + 1)` called from a Python loop (us per call)",
    "mixed": "R = 3 replays of the N-kernel graph separated by XLA elementwise ops (`x * 2 - 3`) in one jit, "
             "one fixed input",
    "mixed_changing": "as mixed, rotating over 8 input arrays",
    "mixed_calls": "the mixed program with each replay's kernels as N `Kernel.jax_call`s (XLA's own way)",
    "mixed_calls_changing": "as mixed_calls, rotating over 8 input arrays",
    **{f"loop_k{k}": f"`jaxgraph.graphed_loop(step, R, feed={{0: 0}}, unroll={k}).replay()`: R steps in one launch"
       for k in LOOP_UNROLLS},
    "loop_kdefault": "the device loop with K from `jaxgraph.default_unroll` (64 at N=1, 10 at N=10, 2 at N=100)",
    "loop_until": "the device loop with an `until=` flag no kernel sets, the default exact stop: K unguarded steps "
                  "per WHILE trip (16 at N=1), each followed by a watch kernel (launched through a programmatic "
                  "edge after a one-kernel step) that would snapshot the state on the step that sets the flag",
    "loop_until_k1": "as loop_until with `check_every=1`: the exact stop without speculation, a WHILE trip per step, "
                     "its check kernel copying y -> x (a pair up to 256 KiB; larger: the swapped twin behind an IF)",
    **{f"loop_until_k{k}": f"the device loop with `until=` and `check_every={k}`: {k} unchecked steps per WHILE "
       f"trip (up to {k - 1} past the flag)" for k in LOOP_CHECK_EVERY},
    "jnp_fori": "idiomatic JAX: `lax.fori_loop` of R steps of `x + 1` (N times; XLA fuses them) in one jit",
    "jnp_while": "idiomatic JAX with a data-dependent stop: `lax.while_loop` of the same steps while "
                 "`i < R and x[0] < 1e30`, in one jit",
    "loop_jit_until": "the device loop with `until=` (exact) inside `jax.jit`: `(y, steps_run) = loop(x)`",
    **{f"loop_jit_until_k{k}": f"as loop_jit_until with `check_every={k}`" for k in LOOP_CHECK_EVERY},
    "loop_copy": "loop_kdefault with `ping_pong=\"copy\"`: a device copy y -> x after each step instead of swapping",
    "loop_unrolled": "R * N kernels captured in one graph, raw `cuGraphLaunch` (the loops' floor)",
    "loop_jit": "the device loop inside `jax.jit`: one FFI call runs the R steps",
    "xla_fori": "R trips of N `Kernel.jax_call`s in one jitted `lax.fori_loop` (XLA's own loop)",
    "xla_while": "the same N `Kernel.jax_call`s a trip in a data-stopped jitted `lax.while_loop` (while `i < R and "
                 "x[0] < 1e30`, as jnp_while): XLA's own loop with a data-dependent stop",
}

SCALAR_INFO = {
    "capture_1000": "capture + instantiate of 1000 launches with `jaxgraph.graph` (ms)",
    "eager.jaxgraph_bound": "`kernel[grid, block, 0, s](y, x, n)`",
    "eager.jaxgraph_index": "`kernel[grid, block, 0, s](y, x, n)`, indexed on every launch",
    "eager.jaxgraph_launch": "`kernel.launch(y, x, n, grid=..., block=..., stream=s)`",
    "eager.torch_add": "torch eager `torch.add(x, 1, out=y)`",
    "eager.cuda_core": "cuda.core `launch(stream, config, kernel, y.ptr, x.ptr, n32)`, pre-typed",
    "eager.jaxgraph_checks_cuda_core": "jaxgraph's argument checks, then cuda.core `launch` with typed args",
}

UNROLL = 10           # replays per jit_unrolled call
MIXED_REPLAYS = 3     # replays (or chains of jax_calls) per mixed call, XLA ops between them
CHANGING_INPUTS = 8   # input arrays jit_changing rotates over
CAPTURE_LAUNCHES = 1000


def fori_trips(n: int) -> int:
    """Replays per ``jit_fori`` call: about 10,000 kernels, between 10 and 1000 trips."""
    return max(10, min(1000, 10_000 // max(1, n)))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Budgets of one run; the driver passes it to each worker as JSON."""

    ns: tuple = (1, 10, 100, 1000)
    repeats: int = 7             # interleaved rounds over the modes
    target_ms: float = 25.0      # wall time aimed at per sample (calls per sample are calibrated)
    max_calls: int = 20_000      # cap on calls per sample
    jax_calls_budget_s: float = 40.0  # skip a jax_calls N whose compile is estimated above this
    quick: bool = False
    modes: tuple | None = None   # run only these modes and scalars (None: all); the floor always runs
    loops: bool = False          # the loop modes (loop_modes.py) instead of the chain modes
    capture_policy: str | None = None  # jaxgraph.diagnostics.CapturePolicy for the JAX processes (None: default)

    def runs(self, key: str) -> bool:
        """Whether mode (or scalar) ``key`` is measured in this run."""
        return self.modes is None or key == FLOOR or key in self.modes

    def to_json(self) -> dict:
        modes = list(self.modes) if self.modes is not None else None
        return {**dataclasses.asdict(self), "ns": list(self.ns), "modes": modes}

    @classmethod
    def from_json(cls, data: dict) -> "RunConfig":
        modes = data.get("modes")
        return cls(**{**data, "ns": tuple(int(n) for n in data["ns"]),
                      "modes": tuple(modes) if modes is not None else None})


FULL = RunConfig()
# Quick samples are as long as full ones: a sample's first call starts on an idle device and its
# last is waited for, a cost per sample that is larger for XLA's modes than for the floor. With
# 5 ms samples, on one machine, replay in jit at N = 100 read 1.04-1.07x the floor and jit_unrolled
# 1.03-1.20x, against 1.02-1.03x and 1.00-1.02x with 25 ms (tests/GPU_RESULTS.md, session 6).
QUICK = RunConfig(ns=(1, 100), repeats=3, target_ms=25.0, jax_calls_budget_s=15.0, quick=True)
LOOPS = RunConfig(ns=(1, 10, 100), repeats=5, target_ms=10.0, loops=True,
                  modes=tuple(dict.fromkeys(LOOP_NOJAX_MODES + LOOP_JAX_MODES)))
