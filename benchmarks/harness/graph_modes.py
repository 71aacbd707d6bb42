"""Modes that replay a CUDA graph from Python without JAX: the raw floor, ``g.replay()``, PyTorch.

- ``raw``: ``cuda.bindings.driver.cuGraphLaunch`` of the jaxgraph graph's
  executable in a Python loop: the floor every ratio is taken to.
- ``replay``: ``g.replay()`` in a Python loop on a jaxgraph stream.
- ``torch_cupy``: the same CUDA source compiled by ``cupy.RawKernel``,
  launched on torch's capture stream into a ``torch.cuda.CUDAGraph``.
- ``torch_add``: the chain as ``torch.add(x, 1, out=y)`` in a torch graph.

All are timed with CUDA events on the stream they launch on. Each factory
checks one replay against numpy before returning the mode.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .timing import Mode, Skip
from .workload import BLOCK, ELEMENTS, GRID, SOURCE, Chain, check_result, random_input

__all__ = ["event_timer", "import_torch", "raw", "replay", "torch_add", "torch_cupy"]


def raw(chain: Chain, stream: Any, rng: np.random.Generator) -> Mode:
    """``cuGraphLaunch(CUgraphExec(g.raw_cuda_graph_exec()), stream)`` in a loop."""
    import jaxgraph
    from cuda.bindings import driver as cu

    h_exec = cu.CUgraphExec(chain.graph.raw_cuda_graph_exec())
    h_stream = stream.handle
    launch, success = cu.cuGraphLaunch, cu.CUresult.CUDA_SUCCESS

    def launch_all(calls: int) -> None:
        for _ in range(calls):
            (err,) = launch(h_exec, h_stream)
            if err != success:
                raise jaxgraph.CudaError("cuGraphLaunch", err)

    run = event_timer(stream, launch_all)
    check = chain.check(lambda: run(1), rng)
    return Mode("raw", run, per_call=chain.n, clock="cuda_event", check=check)


def replay(chain: Chain, stream: Any, rng: np.random.Generator) -> Mode:
    """``g.replay()`` in a loop, with ``stream`` current."""
    import jaxgraph

    graph = chain.graph

    def replay_all(calls: int) -> None:
        with jaxgraph.stream(stream):
            for _ in range(calls):
                graph.replay()

    run = event_timer(stream, replay_all)
    check = chain.check(lambda: run(1), rng)
    return Mode("replay", run, per_call=chain.n, clock="cuda_event", check=check)


def torch_cupy(n: int, rng: np.random.Generator) -> Mode:
    """A torch graph of N launches of the same source through ``cupy.RawKernel``."""
    torch = import_torch()
    try:
        import cupy
    except ImportError as exc:
        raise Skip(f"cupy is not installed ({exc})") from None
    kernel = cupy.RawKernel(SOURCE, "add_one")
    x_t = torch.zeros(ELEMENTS, device="cuda")
    y_t = torch.zeros(ELEMENTS, device="cuda")
    n32 = np.int32(ELEMENTS)  # a Python int would reach the kernel as 8 bytes

    def launch_chain(steps: int) -> None:
        # CuPy launches on its current stream: make it torch's (the capture stream inside torch.cuda.graph).
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((GRID,), (BLOCK,), (y_t.data_ptr(), x_t.data_ptr(), n32))
            for _ in range(steps - 1):
                kernel((GRID,), (BLOCK,), (y_t.data_ptr(), y_t.data_ptr(), n32))

    launch_chain(1)  # NVRTC compile and module load must happen before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_chain(n)
    return _torch_graph_mode("torch_cupy", torch, graph, x_t, y_t, n, rng)


def torch_add(n: int, rng: np.random.Generator) -> Mode:
    """A torch graph of ``torch.add(x, 1, out=y)`` then N - 1 ``torch.add(y, 1, out=y)``."""
    torch = import_torch()
    x_t = torch.zeros(ELEMENTS, device="cuda")
    y_t = torch.zeros(ELEMENTS, device="cuda")
    torch.add(x_t, 1, out=y_t)  # eager warm-up before capture, as torch's docs advise
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.add(x_t, 1, out=y_t)
        for _ in range(n - 1):
            torch.add(y_t, 1, out=y_t)
    return _torch_graph_mode("torch_add", torch, graph, x_t, y_t, n, rng)


# ----------------------------------------------------------------------------
# Timing and imports shared with extras.py
# ----------------------------------------------------------------------------


def event_timer(stream: Any, body: Callable[[int], None]) -> Callable[[int], float]:
    """``run(calls)``: device idle, event, ``body(calls)``, event; the seconds between the events."""
    import jaxgraph

    start = jaxgraph.Event(enable_timing=True)
    end = jaxgraph.Event(enable_timing=True)

    def run(calls: int) -> float:
        jaxgraph.synchronize()
        start.record(stream)
        body(calls)
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return run


def import_torch() -> Any:
    """``torch`` with CUDA, or :class:`~benchmarks.harness.timing.Skip` saying why not."""
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from None
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    return torch


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _torch_graph_mode(key: str, torch: Any, graph: Any, x_t: Any, y_t: Any, n: int,
                      rng: np.random.Generator) -> Mode:
    """Check one replay of a torch graph against numpy; time replays with torch's CUDA events."""
    x = random_input(rng)
    x_t.copy_(torch.from_numpy(x))
    y_t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check = check_result(y_t.cpu().numpy(), x, n)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def run(calls: int) -> float:
        torch.cuda.synchronize()
        start.record()  # on torch's current stream, where replay() launches
        for _ in range(calls):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return Mode(key, run, per_call=n, clock="cuda_event", check=check)
