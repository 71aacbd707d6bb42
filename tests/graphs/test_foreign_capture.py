"""Foreign arrays (CuPy, torch) passed straight to a kernel launch while a graph captures.

The CUDA Array Interface (v3) names the stream that produced an array, and a
consumer must come after that stream's work. Outside captures the host waits
for it, as always. During a capture nothing may synchronize, so the order is
kept on the device: an external event wait recorded into the graph when the
producer stream does not capture (its replays wait for the producer's work),
nothing when the producer is the capture stream, an edge when the producer
takes part in the same capture. torch's interface (v2) names no stream.
"""

import jax
import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import GRAPH_KERNELS, blocks, cupy_stream, poison

pytestmark = pytest.mark.gpu

N = 1 << 20


@pytest.fixture(scope="module")
def axpb():
    k = jaxgraph.Kernel(GRAPH_KERNELS, "axpb")  # axpb(y, x, a, b, n): y = a x + b
    k.handle  # noqa: B018 - loaded before any capture
    return k


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


def ref(x):
    return np.float32(3.0) * x + np.float32(1.0)


def node_types(g):
    return [n["node_type"] for n in g.get_graph_data()["nodes"]]


def busy_then_write(cp, x_cp, values):
    """Queue slow work on CuPy's current stream, then write ``values`` into ``x_cp`` there:
    a replay not ordered after that stream would read ``x_cp`` before the write."""
    big = cp.ones(1 << 26, cp.float32)  # 40 passes over 256 MiB: the stream stays busy a while
    for _ in range(40):
        cp.multiply(big, 1.0001, out=big)
    x_cp[...] = values


def pending_producer(cp, producer, rng):
    """``(values, x_cp, stream)``: CuPy's legacy stream or a new non-blocking one, on which
    :func:`busy_then_write` is to write ``values`` into the zeroed ``x_cp``."""
    values = cp.asarray(rng.standard_normal(N).astype(np.float32))
    x_cp = cp.zeros(N, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True) if producer == "side" else cp.cuda.Stream.null
    cp.cuda.Device().synchronize()
    return values, x_cp, stream


def check_later_replays(g, y_s, set_input, want, rng):
    """Two replays on fresh host values: each reads the input's current contents."""
    for _ in range(2):
        host = rng.standard_normal(N).astype(np.float32)
        set_input(host)
        poison(y_s)
        g.replay()
        np.testing.assert_allclose(y_s.numpy(), want(host), rtol=1e-6, atol=1e-6)


def capture(axpb, x, y_s, *, cupy_stream=None, keep_graph=True):
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    with jaxgraph.graph(g):
        if cupy_stream is None:
            axpb[blocks(N), 256](y_s, x, 3.0, 1.0, N)
        else:
            with cupy_stream(jaxgraph.current_stream()):
                axpb[blocks(N), 256](y_s, x, 3.0, 1.0, N)
    if keep_graph:
        g.instantiate()
    return g


@pytest.mark.parametrize("producer", ["legacy", "side"])
def test_cupy_array_from_a_non_capturing_stream_is_ordered_by_a_wait_in_the_graph(axpb, cupy, producer, rng):
    cp = cupy
    values, x_cp, side = pending_producer(cp, producer, rng)
    y_s = jaxgraph.empty(N)
    with side:  # the producer's pending work, then the launch that hands x_cp over (CAI stream: side)
        busy_then_write(cp, x_cp, values)
        g = capture(axpb, x_cp, y_s)
    types = node_types(g)
    print(f"{producer}: graph nodes {types}")
    assert types.count("wait_event") == 1 and types.count("kernel") == 1
    replay_stream = jaxgraph.Stream()  # non-blocking: ordered with the producer only by the graph's wait
    with jaxgraph.stream(replay_stream):
        poison(y_s)
        g.replay()
    replay_stream.synchronize()
    np.testing.assert_allclose(y_s.numpy(), ref(cp.asnumpy(values)), rtol=1e-6, atol=1e-6)
    check_later_replays(g, y_s, lambda host: (x_cp.set(host), cp.cuda.Device().synchronize()), ref, rng)


def test_cupy_array_on_the_capture_stream_needs_no_wait(axpb, cupy, rng):
    cp = cupy
    host = rng.standard_normal(N).astype(np.float32)
    x_cp = cp.asarray(host)
    y_s = jaxgraph.empty(N)
    cp.cuda.Device().synchronize()
    g = capture(axpb, x_cp, y_s, cupy_stream=lambda s: cupy_stream(cp, s))
    assert node_types(g) == ["kernel"]
    poison(y_s)
    g.replay()
    np.testing.assert_allclose(y_s.numpy(), ref(host), rtol=1e-6, atol=1e-6)


def test_cupy_work_forked_into_the_capture_joins_the_launch(axpb, cupy, rng):
    """The producer stream takes part in the same capture: an edge, no external wait."""
    cp = cupy
    src = cp.asarray(rng.standard_normal(N).astype(np.float32))
    x_cp = cp.zeros(N, cp.float32)
    cp.multiply(src, 2.0, out=x_cp)  # compiles CuPy's kernel before the capture
    y_s = jaxgraph.empty(N)
    fork = jaxgraph.Stream()
    cp.cuda.Device().synchronize()
    g = jaxgraph.CUDAGraph(keep_graph=True)
    with jaxgraph.graph(g):
        fork.wait_stream(jaxgraph.current_stream())  # fork joins the capture
        with cupy_stream(cp, fork):
            cp.multiply(src, 2.0, out=x_cp)          # captured on the fork
            axpb[blocks(N), 256](y_s, x_cp, 3.0, 1.0, N)  # on the capture stream, after the fork's work
    g.instantiate()
    types = node_types(g)
    print(f"fork: graph nodes {types}")
    assert "wait_event" not in types and types.count("kernel") == 2
    check_later_replays(g, y_s, lambda host: (src.set(host), cp.cuda.Device().synchronize()),
                        lambda host: ref(2 * host), rng)


def test_a_graph_with_a_cupy_input_replays_inside_jit(axpb, cupy, rng):
    cp = cupy
    x_cp = cp.zeros(N, cp.float32)
    y_s = jaxgraph.empty(N)
    g = capture(axpb, x_cp, y_s, keep_graph=False)  # a wait node from the legacy stream
    step = jaxgraph.replayable(g, [x_cp], [y_s])
    print("bindings:", step.bindings)
    for _ in range(2):
        x = rng.standard_normal(N).astype(np.float32)
        np.testing.assert_allclose(np.asarray(jax.jit(lambda x: step(x) - 1)(x)), ref(x) - 1, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("producer", ["default", "side"])
def test_torch_tensor_in_a_capture(axpb, producer, rng):
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream() if producer == "side" else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        x_t = torch.zeros(N, device="cuda")
        y_s = jaxgraph.empty(N)
        g = capture(axpb, x_t, y_s, keep_graph=False)
    # torch's interface names no stream: order by hand.
    check_later_replays(g, y_s, lambda host: (x_t.copy_(torch.from_numpy(host)), torch.cuda.synchronize()), ref, rng)


@pytest.mark.parametrize("producer", ["legacy", "side"])
def test_eager_launch_waits_for_the_producer_as_before(axpb, cupy, producer, rng):
    cp = cupy
    values, x_cp, side = pending_producer(cp, producer, rng)
    y = jaxgraph.empty(N)
    with side:
        busy_then_write(cp, x_cp, values)
        launch_stream = jaxgraph.Stream()  # not ordered with CuPy's stream except by the host's wait
        axpb[blocks(N), 256, 0, launch_stream](y, x_cp, 3.0, 1.0, N)
    launch_stream.synchronize()
    np.testing.assert_allclose(y.numpy(), ref(cp.asnumpy(values)), rtol=1e-6, atol=1e-6)
