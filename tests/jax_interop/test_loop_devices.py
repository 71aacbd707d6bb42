"""Graphed loops of a step captured on another device than the current one (GPU, two devices).

A step captured on device 1 while device 0 is current: :func:`jaxgraph.graphed_loop`
puts the loop's own counters (the count it owns, the steps left, ``steps_run``)
on the step's device, where the loop's kernels read them, and the loop runs
exactly the steps numpy does. Skips with "needs 2 CUDA devices" on one.
"""

import types

import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import on_device
from support.kernel_sources import LOOP_STEP
from support.loop_helpers import ref

pytestmark = pytest.mark.gpu

N = 1000
BLOCK = 256


def step_on(device, rng, stop_at):
    """The loop tests' step (x -> y = x/2 + b, a counter, a stop flag) captured on ``device``, device 0 current."""
    kernel = jaxgraph.Kernel(LOOP_STEP, "lstep")
    kernel.handle  # noqa: B018 - loaded before the capture

    def make():
        s = types.SimpleNamespace()
        s.x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
        s.b = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
        s.y, s.counter, s.flag = jaxgraph.zeros(N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
        s.stop = jaxgraph.asarray(np.array([stop_at], np.int32))
        s.stream = jaxgraph.Stream()
        return s

    s = on_device(device, make)
    s.g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(s.g, stream=s.stream):  # makes the stream's device current for the body
        kernel[(N + BLOCK - 1) // BLOCK, BLOCK](s.y, s.x, s.b, s.counter, s.flag, s.stop, N)
    assert s.g.device == device and jaxgraph.current_device() == 0
    return s


def test_a_loop_of_a_step_on_device_1_counts_on_device_1(rng):
    if jaxgraph.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices (this machine has {jaxgraph.device_count()})")
    stop_at = 9
    s = step_on(1, rng, stop_at)
    loop = jaxgraph.graphed_loop(s.g, feed={0: 0}, until=s.flag, inputs=[s.x, s.b], outputs=[s.y],
                                  preserve=[s.counter])  # the counter is no static array: as if no step ran past
    assert jaxgraph.current_device() == 0
    # Checked before any launch: counters on device 0 would be read by device 1's kernels.
    assert (loop.count.device, loop.steps_run.device) == (1, 1), "the loop's counters are not on the step's device"
    assert loop.graph.device == 1
    for steps in (5, 20, 0):
        x0 = rng.standard_normal(N).astype(np.float32)
        s.x.copy_(x0)
        s.y.fill_(np.float32(np.nan))
        s.counter.fill_(0)
        loop.steps_run.fill_(-7)
        on_device(1, jaxgraph.synchronize)
        loop.replay(steps=steps)  # device 0 current: replays on the graph's device
        want = min(steps, stop_at)
        assert (int(s.counter.numpy()[0]), int(loop.steps_run.numpy()[0])) == (want, want), steps
        if want:
            np.testing.assert_allclose(s.y.numpy(), ref(x0, s.b.numpy(), want), rtol=1e-5, atol=1e-6)
    assert jaxgraph.current_device() == 0
