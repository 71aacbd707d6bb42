"""N-independent figures: capture + instantiate of 1000 launches, and eager launch overhead.

- ``capture_1000``: wall time of ``with jaxgraph.graph(g):`` around 1000
  launches, instantiation included (``capture_end`` instantiates), in ms.
- ``eager.*``: host time per eager launch of the same kernel, back to back
  on a warm queue, in us: jaxgraph ``kernel[grid, block, 0, s](...)``,
  ``kernel[grid, block, 0, s](...)`` indexed every launch,
  jaxgraph ``kernel.launch(...)``, torch eager ``torch.add``, cuda.core
  ``launch`` with pre-typed arguments (no checks: the cheapest Python launch),
  and jaxgraph's checks followed by cuda.core's launch (would jaxgraph be
  faster launching through cuda.core?).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .config import CAPTURE_LAUNCHES
from .graph_modes import import_torch
from .timing import Mode
from .workload import BLOCK, ELEMENTS, GRID, Chain, check_result, random_input

__all__ = ["capture", "eager_factories"]


def capture(kernel: Any, rng: np.random.Generator, launches: int = CAPTURE_LAUNCHES) -> Mode:
    """Capture + instantiate ``launches`` kernels into a new graph per call (ms per capture)."""
    import jaxgraph

    x_s, y_s = jaxgraph.zeros(ELEMENTS, np.float32), jaxgraph.zeros(ELEMENTS, np.float32)
    chain = Chain(kernel, launches, x_s, y_s)
    check = chain.check(chain.graph.replay, rng)
    chain.close()

    def run(calls: int) -> float:
        total = 0.0
        for _ in range(calls):
            jaxgraph.synchronize()
            start = time.perf_counter()
            graph = Chain(kernel, launches, x_s, y_s).graph
            total += time.perf_counter() - start
            graph.reset()  # destroying it is not part of the figure
        return total

    return Mode("capture_1000", run, per_call=1, unit="ms", clock="wall", check=check,
                info={"launches": launches})


def eager_factories(kernel: Any, stream: Any, rng: np.random.Generator) -> list[tuple[str, Callable[[], Mode]]]:
    """The eager-launch ways, as (key, factory) pairs for :func:`~benchmarks.harness.timing.measure_group`."""
    def jaxgraph_bound() -> Mode:
        bound = kernel[GRID, BLOCK, 0, stream]
        return _jaxgraph_mode("eager.jaxgraph_bound", lambda y, x: bound(y, x, ELEMENTS), stream, rng)

    def jaxgraph_index() -> Mode:
        # As most programs write it, indexed on every launch (on the same stream
        # as the other ways: the legacy default stream may cost the driver more).
        return _jaxgraph_mode("eager.jaxgraph_index", lambda y, x: kernel[GRID, BLOCK, 0, stream](y, x, ELEMENTS),
                              stream, rng)

    def jaxgraph_launch() -> Mode:
        def launch(y, x):
            kernel.launch(y, x, ELEMENTS, grid=GRID, block=BLOCK, stream=stream)
        return _jaxgraph_mode("eager.jaxgraph_launch", launch, stream, rng)

    def core_parts() -> tuple:
        """Our own module load of the same cubin (as jaxgraph's Kernel loads it), the stream and the geometry
        as cuda.core takes them: ``(module, kernel, stream, config)``."""
        from cuda.core import LaunchConfig, ObjectCode
        from cuda.core import Stream as CoreStream

        code = ObjectCode.from_cubin(kernel.cubin, symbol_mapping={"add_one": kernel.lowered_name.encode()})
        return code, code.get_kernel("add_one"), CoreStream.from_handle(int(stream)), LaunchConfig(grid=GRID,
                                                                                                   block=BLOCK)

    def cuda_core() -> Mode:
        from cuda.core import launch

        code, core_kernel, core_stream, config = core_parts()
        n32 = np.int32(ELEMENTS)  # pre-typed; Python ints pass as pointers

        def launch_core(y, x, _module=code):  # the module stays loaded while the mode lives
            launch(core_stream, config, core_kernel, y.ptr, x.ptr, n32)

        return _jaxgraph_mode("eager.cuda_core", launch_core, stream, rng)

    def jaxgraph_checks_cuda_core() -> Mode:
        # Would jaxgraph's launch be faster through cuda.core? The same checks
        # and encoding as kernel[grid, block](...), then cuda.core's launch
        # with arguments typed from the kernel's parameters.
        from cuda.core import launch

        from jaxgraph import diagnostics

        code, core_kernel, core_stream, config = core_parts()
        scalar_types = [p.dtype.type for p in kernel.params]
        checks = diagnostics.argument_checks(kernel)

        def launch_checked(y, x, _module=code):
            values, _ = checks((y, x, ELEMENTS))
            launch(core_stream, config, core_kernel, values[0], values[1], scalar_types[2](values[2]))

        return _jaxgraph_mode("eager.jaxgraph_checks_cuda_core", launch_checked, stream, rng)

    def torch_add() -> Mode:
        torch = import_torch()
        x_host = random_input(rng)
        x_t = torch.from_numpy(x_host).cuda()
        y_t = torch.full_like(x_t, float("nan"))
        torch.add(x_t, 1, out=y_t)
        torch.cuda.synchronize()
        check = check_result(y_t.cpu().numpy(), x_host, 1)
        return Mode("eager.torch_add", _host_timer(lambda: torch.add(x_t, 1, out=y_t), torch.cuda.synchronize),
                    unit="us_per_launch", clock="wall", check=check)

    return [("eager.jaxgraph_bound", jaxgraph_bound), ("eager.jaxgraph_index", jaxgraph_index),
            ("eager.jaxgraph_launch", jaxgraph_launch),
            ("eager.torch_add", torch_add), ("eager.cuda_core", cuda_core),
            ("eager.jaxgraph_checks_cuda_core", jaxgraph_checks_cuda_core)]


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _jaxgraph_mode(key: str, launch: Callable[[Any, Any], None], stream: Any, rng: np.random.Generator) -> Mode:
    """Check ``launch(y, x)`` once against numpy on fresh input, then time it back to back."""
    import jaxgraph

    x_host = random_input(rng)
    x, y = jaxgraph.asarray(x_host), jaxgraph.empty(ELEMENTS, np.float32)
    y.fill_(np.nan)
    jaxgraph.synchronize()
    launch(y, x)
    stream.synchronize()
    check = check_result(y.numpy(), x_host, 1)
    return Mode(key, _host_timer(lambda: launch(y, x), stream.synchronize), unit="us_per_launch",
                clock="wall", check=check)


def _host_timer(launch: Callable[[], Any], sync: Callable[[], None]) -> Callable[[int], float]:
    """``run(calls)``: host seconds for ``calls`` launches, queue drained before and after (not timed)."""
    def run(calls: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            launch()
        elapsed = time.perf_counter() - start
        sync()
        return elapsed

    return run
