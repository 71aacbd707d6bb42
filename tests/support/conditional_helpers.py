"""Graphs with conditional nodes made by hand inside a jaxgraph capture, for the replay tests;
the kernels and one-element predicates of the capture-API tests (test_conditional*.py).

Until the capture API for branches and loops lands, these tests add CUDA
conditional nodes (IF/ELSE, WHILE, SWITCH, nested) to a jaxgraph capture with
cuda.bindings, capturing each body on a side stream (cuStreamBeginCaptureToGraph),
as PyTorch does. :class:`Conditionals` records the bodies and the kernels
launched in them, which :func:`replayable` hands to the replay (the capture
API records them itself).

Tests internals (listed in tests/README.md): ``_replay_contract.source_of`` patched with the
bodies of hand-made conditional nodes; conditional nodes built with cuda.bindings inside a
jaxgraph capture, beside the capture API.
"""

import contextlib
import dataclasses
import os
import subprocess
import sys
from unittest import mock

import numpy as np

from support import graph_helpers
import jaxgraph
import jaxgraph._jax_interop.replay_contract
from jaxgraph._kernels.load import node_handles
from jaxgraph._jax_interop.replay_contract import source_of
from jaxgraph._kernels.signature import access_flags
from support.kernel_sources import ACCUMULATE, AXPB, CONDITIONAL, LOOP_FLAG, SET_CONDITIONAL

N = 4096
BLOCK = 256
GRID = (N + BLOCK - 1) // BLOCK

KERNELS = SET_CONDITIONAL + LOOP_FLAG + AXPB + ACCUMULATE

NAMES = ("set_condition", "start_count", "count_down_while", "start_loop", "step_loop", "axpb", "accumulate")

# XLA flag settings the jit tests run under, one worker process each.
XLA_MODES = {
    "off": "--xla_gpu_enable_command_buffer=",
    "on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
    "defaults": "",
}


def load_kernels():
    import types

    ks = {name: jaxgraph.Kernel(KERNELS, name) for name in NAMES}
    for k in ks.values():
        k.handle  # noqa: B018 - loads it before any capture
    return types.SimpleNamespace(**ks)


def capture_api_kernels():
    """The graph kernels (``graph_helpers.load_kernels``) and ``kernel_sources.CONDITIONAL``'s, loaded
    before any capture: the kernels of test_conditional.py and test_conditional_loops.py."""
    ks = graph_helpers.load_kernels()
    for name in ("add_inplace", "count_down", "is_even", "store_row"):
        kernel = jaxgraph.Kernel(CONDITIONAL, name)
        kernel.handle  # noqa: B018 - load before any capture
        setattr(ks, name, kernel)
    return ks


def device(values, dtype):
    """``values`` as a new DeviceArray of ``dtype``."""
    return jaxgraph.asarray(np.asarray(values, dtype=dtype))


def set_value(array, value):
    """Change a one-element predicate between replays (a host copy, outside any capture)."""
    array.copy_(np.asarray([value], dtype=array.dtype))


def _check(result):
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return values[0] if len(values) == 1 else values


class Conditionals:
    """Adds conditional nodes to captures on jaxgraph streams; records their bodies and body kernels."""

    def __init__(self, device: int):
        from cuda.bindings import driver

        self.drv = driver
        self.device = device
        self.bodies: list[int] = []
        self.kernels: dict[int, str] = {}
        self._spare = [jaxgraph.Stream() for _ in range(4)]  # body capture streams, made before any capture

    def handle(self, stream, default: int = 0) -> int:
        """A conditional handle for a node that will be added to the graph ``stream`` captures into."""
        d = self.drv
        _, _, graph, _, _, _ = _check(d.cuStreamGetCaptureInfo(stream.handle))
        ctx = _check(d.cuCtxGetCurrent())
        flags = int(d.CU_GRAPH_COND_ASSIGN_DEFAULT)
        return int(_check(d.cuGraphConditionalHandleCreate(graph, ctx, default, flags)))

    def add(self, stream, handle: int, kind: str, size: int = 1) -> list:
        """Add a conditional node after the work captured on ``stream``; return its body graphs."""
        d = self.drv
        _, _, graph, deps, _, count = _check(d.cuStreamGetCaptureInfo(stream.handle))
        params = d.CUgraphNodeParams()
        params.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = d.CUgraphConditionalHandle(handle)
        params.conditional.type = getattr(d.CUgraphConditionalNodeType, f"CU_GRAPH_COND_TYPE_{kind}")
        params.conditional.size = size
        params.conditional.ctx = _check(d.cuCtxGetCurrent())
        node = _check(d.cuGraphAddNode(graph, list(deps)[:count], None, count, params))
        _check(d.cuStreamUpdateCaptureDependencies(
            stream.handle, [node], None, 1,
            int(d.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES)))
        bodies = [params.conditional.phGraph_out[i] for i in range(size)]
        self.bodies += [int(b) for b in bodies]
        return bodies

    @contextlib.contextmanager
    def body(self, graph):
        """Capture into a body graph on a side stream; yields the stream to launch on."""
        d = self.drv
        stream = self._spare.pop()
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        _check(d.cuStreamBeginCaptureToGraph(stream.handle, graph, None, None, 0, mode))
        try:
            yield stream
        finally:
            _check(d.cuStreamEndCapture(stream.handle))
            self._spare.append(stream)

    def launch(self, kernel, stream, *args, grid=GRID, block=BLOCK):
        """Launch a jaxgraph kernel into a body, noting its parameter flags as a capture would."""
        kernel.launch(*args, grid=grid, block=block, stream=stream)
        for h in node_handles(kernel, self.device):
            self.kernels[h] = access_flags(kernel.params)


def replayable(g, inputs, outputs, cond: Conditionals | None, *, bodies=True, **options):
    """``jaxgraph.replayable`` of ``g``, told the bodies and body kernels ``cond`` recorded
    (``cond`` None: a graph of the capture API, which records them itself)."""
    if cond is None:
        return jaxgraph.replayable(g, inputs, outputs, **options)
    source = source_of(g)
    kernels = {**dict(source.kernels), **cond.kernels}
    patched = dataclasses.replace(source, kernels=tuple(kernels.items()),
                                  bodies=tuple(cond.bodies) if bodies else ())
    # What the capture API records itself: the replayable is built from this source.
    with mock.patch.object(jaxgraph._jax_interop.replay_contract, "source_of", lambda graph: patched):
        return jaxgraph.replayable(g, inputs, outputs, **options)


# ----------------------------------------------------------------------------
# The graphs (each returns the CUDAGraph, Conditionals, static inputs, outputs, numpy reference)
# ----------------------------------------------------------------------------


@contextlib.contextmanager
def counted_while(k, cond, x, y, n, counter):
    """In a capture: y = 0, then a WHILE node of ``n[0]`` trips (none when 0, at most 64).

    Yields the body's stream; the body's last kernel, added on leaving, counts the trip
    down in ``counter`` (an int32[1] allocated before the capture).
    """
    s = jaxgraph.current_stream()
    k.axpb[GRID, BLOCK](y, x, 0.0, 0.0, N)
    h = cond.handle(s)
    k.start_count[1, 1](h, counter, n)
    (body,) = cond.add(s, h, "WHILE")
    with cond.body(body) as b:
        yield b
        cond.launch(k.count_down_while, b, h, counter, grid=1, block=1)


def ref_if_else(xv, p):
    return 2 * xv + 1 if p[0] else -xv


def ref_while(xv, nv):
    return np.float32(nv[0]) * xv


def if_else_graph(k):
    """y = 2x + 1 if pred else -x: an IF/ELSE node whose predicate is a device input."""
    x, pred, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    cond = Conditionals(jaxgraph.current_device())
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        s = jaxgraph.current_stream()
        h = cond.handle(s)
        k.set_condition[1, 1](h, pred)
        then, otherwise = cond.add(s, h, "IF", 2)
        with cond.body(then) as b:
            cond.launch(k.axpb, b, y, x, 2.0, 1.0, N)
        with cond.body(otherwise) as b:
            cond.launch(k.axpb, b, y, x, -1.0, 0.0, N)

    return g, cond, [x, pred], [y], ref_if_else


def while_graph(k):
    """y = n * x: y zeroed, then a WHILE node adds x to y n times (n a device input)."""
    x, n, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    counter = jaxgraph.zeros(1, np.int32)
    cond = Conditionals(jaxgraph.current_device())
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with counted_while(k, cond, x, y, n, counter) as b:
            cond.launch(k.accumulate, b, y, x, N)

    return g, cond, [x, n], [y], ref_while


def nested_graph(k):
    """y = n * x if pred else 0: an IF node inside a WHILE body."""
    x, n, pred, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    counter = jaxgraph.zeros(1, np.int32)
    cond = Conditionals(jaxgraph.current_device())
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with counted_while(k, cond, x, y, n, counter) as b:
            inner = cond.handle(b)
            cond.launch(k.set_condition, b, inner, pred, grid=1, block=1)
            (then,) = cond.add(b, inner, "IF")
            with cond.body(then) as bb:
                cond.launch(k.accumulate, bb, y, x, N)

    def ref(xv, nv, p):
        return np.float32(nv[0]) * xv if p[0] else np.zeros_like(xv)

    return g, cond, [x, n, pred], [y], ref


def switch_graph(k):
    """y = (i + 1) * x for i in 0..2, else y stays -x: a SWITCH node of three bodies."""
    x, index, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    cond = Conditionals(jaxgraph.current_device())
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        s = jaxgraph.current_stream()
        k.axpb[GRID, BLOCK](y, x, -1.0, 0.0, N)
        h = cond.handle(s)
        k.set_condition[1, 1](h, index)
        for i, body in enumerate(cond.add(s, h, "SWITCH", 3)):
            with cond.body(body) as b:
                cond.launch(k.axpb, b, y, x, float(i + 1), 0.0, N)

    def ref(xv, iv):
        return np.float32(iv[0] + 1) * xv if 0 <= iv[0] < 3 else -xv

    return g, cond, [x, index], [y], ref


# ----------------------------------------------------------------------------
# The user's path: the capture API for branches and loops (jaxgraph.if_then, while_loop)
# ----------------------------------------------------------------------------


def user_if_graph(k):
    """y = 2x + 1 if pred else -x, captured with ``jaxgraph.if_then``."""
    x, pred, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[GRID, BLOCK](y, x, -1.0, 0.0, N)
        with jaxgraph.if_then(pred):
            k.axpb[GRID, BLOCK](y, x, 2.0, 1.0, N)

    return g, None, [x, pred], [y], ref_if_else


def user_while_graph(k):
    """y = n * x, captured with ``jaxgraph.while_loop`` on a flag the body's kernels write."""
    x, n, y = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(N)
    counter, flag = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[GRID, BLOCK](y, x, 0.0, 0.0, N)
        k.start_loop[1, 1](counter, flag, n)
        with jaxgraph.while_loop(flag):
            k.accumulate[GRID, BLOCK](y, x, N)
            k.step_loop[1, 1](counter, flag)

    return g, None, [x, n], [y], ref_while


USER_GRAPHS = {"user_if": (user_if_graph, "if_else"), "user_while": (user_while_graph, "while")}

GRAPHS = {"if_else": if_else_graph, "while": while_graph, "nested": nested_graph, "switch": switch_graph}


def random_inputs(name, rng, trip):
    """Fresh inputs for graph ``name``: x random, the control values varying with ``trip``."""
    x = rng.standard_normal(N).astype(np.float32)
    control = {
        "if_else": [np.array([trip % 2], np.int32)],
        "while": [np.array([(trip * 3) % 5], np.int32)],          # 0, 3, 1, 4, 2 trips
        "nested": [np.array([2 + trip % 3], np.int32), np.array([(trip + 1) % 2], np.int32)],
        "switch": [np.array([(0, 1, 2, 5)[trip % 4]], np.int32)],
    }[name]
    return [x, *control]


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # on a worker's path: it imports support.*


def run_worker(script: str, mode: str, tmp_path) -> str:
    """Run ``script`` in a fresh process under ``mode``'s XLA flags; return its stdout."""
    env = dict(os.environ, XLA_FLAGS=XLA_MODES[mode], XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, f"worker ({mode}) failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout
