"""Eager launch forms: ``kernel[grid, block, shared_mem, stream]``, bound or indexed per launch, and ``kernel.launch``.

CPU (the driver call of a compiled kernel stubbed): each form launches with the
right geometry, stream and context as configurations, streams and threads
change; the configurations a kernel keeps are found again, bounded, and keep no
stream or kernel alive; a capture underway hears of each launch; wrong
configurations and arguments raise the same errors in every form, new or equal
to a kept one. GPU: every form against numpy, fresh inputs, poisoned outputs.

Tests internals (listed in tests/README.md): a Kernel's loaded state and ``_native_launch``
stubbed, ``Kernel._launch_configs``/``_geometries``/``_functions``, a launcher's ``__self__``
(its kept configuration), ``_eager_launch.MAX_LAUNCH_CONFIGS``, ``_cuda.driver._primary_context_addresses``,
``_cuda.capture_registry.capture_on``/``streams_capturing`` (a capture faked), ``_cuda.stream._local.streams`` (made-up
current streams), ``Stream._setup``, ``DeviceArray(..., _token=_INTERNAL)``: the cache has no public face.
"""

import gc
import struct
import threading
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import capture_registry as _captures, driver as _driver, stream as _stream
from jaxgraph._kernels import eager_launch as _eager_launch
from jaxgraph._cuda.array import _INTERNAL, DeviceArray
from jaxgraph._cuda.stream import Stream
from support.kernel_sources import ADD_ONE, REVERSE_BLOCK
from support.launch_stubs import add_one, stub_launches  # noqa: F401  (add_one: a fixture)

N = 3001


def made_up_stream(handle):
    (stream := Stream.__new__(Stream))._setup(handle, 0, None, False)
    return stream


def array(ptr, dtype=np.float32):
    """A DeviceArray at a made-up address: checked and packed, never dereferenced."""
    return DeviceArray(ptr, (8,), np.dtype(dtype), 0, None, _token=_INTERNAL)


def words(y, x, n):  # one 8-byte slot per parameter
    return struct.pack("<QQi4x", y.ptr, x.ptr, n)


def geo(grid, block, shared_mem=0):
    grid = grid if isinstance(grid, tuple) else (grid,)
    block = block if isinstance(block, tuple) else (block,)
    return struct.pack("<7I", *(grid + (1,) * (3 - len(grid))), *(block + (1,) * (3 - len(block))), shared_mem)


@pytest.fixture
def stubbed(add_one, monkeypatch):
    """``add_one`` with its driver call recorded instead of made; a made-up current stream (handle 0x10)."""
    launched = stub_launches(add_one, monkeypatch)
    monkeypatch.setattr(add_one, "_geometries", {})
    monkeypatch.setitem(_stream._local.streams, 0, made_up_stream(0x10))
    return add_one, launched


# The forms, each as launch(kernel, grid, block, shared_mem, stream, args).
FORMS = {
    "index": lambda k, g, b, sm, s, args: (k[g, b](*args) if sm == 0 and s is None else
                                           k[g, b, sm](*args) if s is None else k[g, b, sm, s](*args)),
    "bound": lambda k, g, b, sm, s, args: BOUND.setdefault((id(k), g, b, sm, s), k[g, b, sm, s])(*args),
    "launch": lambda k, g, b, sm, s, args: (k.launch(*args, grid=g, block=b) if sm == 0 and s is None else
                                            k.launch(*args, grid=g, block=b, shared_mem=sm, stream=s)),
}
BOUND: dict = {}  # the bound form's launchers, kept across launches (cleared per test)


@pytest.fixture(autouse=True)
def fresh_bound():
    yield BOUND.clear()
    BOUND.clear()


# ---------------------------------------------------------------------------
# CPU: what reaches the driver, configurations kept (internal)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_each_form_launches_each_configuration_on_its_stream(stubbed, form):
    """Configurations and streams that change launch to launch: each gets its own geometry, stream and context."""
    kernel, launched = stubbed
    s1, s2 = made_up_stream(0x1111), made_up_stream(0x2222)
    rng = np.random.default_rng()
    expected = []
    for i in range(40):
        grid, block, shared_mem = [(16, 256, 0), (3, 128, 64), ((2, 3), (8, 8), 0), (7, 32, 1024)][i % 4]
        stream = [None, s1, s2][i % 3]
        y, x = array(int(rng.integers(1, 2**40)) * 8), array(int(rng.integers(1, 2**40)) * 8)
        n = int(rng.integers(1, 2**31))
        FORMS[form](kernel, grid, block, shared_mem, stream, (y, x, n))
        expected.append((0xF00, 0xC0, 0x10 if stream is None else int(stream), geo(grid, block, shared_mem),
                         words(y, x, n)))
    assert launched == expected


def test_the_current_stream_is_read_at_each_launch(stubbed):
    """A launcher for the current stream follows ``with jaxgraph.stream(s)``, and back."""
    kernel, launched = stubbed
    y, x = array(0x1000), array(0x2000)
    bound = kernel[4, 32]
    side = made_up_stream(0x3333)
    for i in range(6):
        with jaxgraph.stream(side if i % 2 else None):  # None: the current stream stays
            bound(y, x, i)
            kernel[4, 32](y, x, i)
            kernel.launch(y, x, i, grid=4, block=32)
    assert [call[2] for call in launched] == ([0x10] * 3 + [0x3333] * 3) * 3
    launched.clear()

    def other_thread():  # its own current stream, made up there (a new thread has none)
        _stream._local.streams[0] = made_up_stream(0x20)
        bound(y, x, 0)
        kernel[4, 32](y, x, 0)

    for _ in range(2):  # the same launchers, the same kept configuration, alternately on two threads
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        bound(y, x, 0)
    assert [call[2] for call in launched] == [0x20, 0x20, 0x10] * 2


def test_a_configuration_is_checked_once_and_found_again(stubbed, monkeypatch):
    kernel, _ = stubbed
    checked = []
    geometry = _eager_launch.geometry
    monkeypatch.setattr(_eager_launch, "geometry", lambda *a: checked.append(a) or geometry(*a))
    stream = made_up_stream(0x1234)
    for config in [(16, 256), (16, 256, 0, stream), ((2, 2), (8, 8)), (16, 256, 128)]:
        first, again = kernel[config], kernel[config]
        assert first.__self__[-1] is again.__self__[-1]  # the configuration: checked once, then kept
    assert [c[:3] for c in checked] == [(16, 256, 0), ((2, 2), (8, 8), 0), (16, 256, 128)]  # apart from streams
    kernel.launch(array(8), array(16), 1, grid=16, block=256, shared_mem=128)  # kept by kernel[16, 256, 128]
    kernel.launch(array(8), array(16), 1, grid=16, block=256, stream=stream)
    assert len(checked) == 3
    assert kernel[np.int64(16), 256].__self__[-1][1] == geo(16, 256)  # numpy ints: checked every time, never kept
    assert kernel[[2, 2], (8, 8)].__self__[-1][1] == geo((2, 2), (8, 8))  # a list (unhashable) is a grid too
    assert len(checked) == 5


def test_another_stream_at_a_kept_streams_id_is_not_taken_for_it(stubbed):
    """A new stream may get a dead one's ``id``: the kept configuration names its stream weakly, by identity."""
    kernel, launched = stubbed
    old, new = made_up_stream(0xAAAA), made_up_stream(0xBBBB)
    on_old = kernel[4, 32, 0, old]
    on_old(array(8), array(16), 1)
    kept = kernel._launch_configs[(4, 32, 0, id(old))]
    for launch in [lambda: kernel.launch(array(8), array(16), 1, grid=4, block=32, stream=new),
                   lambda: kernel[4, 32, 0, new](array(8), array(16), 1)]:
        kernel._launch_configs[(4, 32, 0, id(new))] = kept  # as if `new` were at `old`'s address
        launch()
        on_old(array(8), array(16), 1)
    assert [call[2] for call in launched] == [0xAAAA, 0xBBBB, 0xAAAA, 0xBBBB, 0xAAAA]


def test_the_cache_keeps_no_stream_and_no_kernel_alive(tmp_path, monkeypatch):
    """Launched on a stream in every form, then dropped: the stream and the kernel go without a garbage collection."""
    monkeypatch.setitem(_driver._primary_context_addresses, 0, 0xC0)
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    kernel._h_kernel, kernel._function_address, kernel._native_launch = 1, 0xF00, lambda *a: 0
    stream = made_up_stream(0x4444)
    for form in FORMS:
        FORMS[form](kernel, 4, 32, 0, stream, (array(8), array(16), 1))
    BOUND.clear()
    gc.disable()
    try:
        stream_ref, kernel_ref = weakref.ref(stream), weakref.ref(kernel)
        del stream
        assert stream_ref() is None
        del kernel
        assert kernel_ref() is None
    finally:
        gc.enable()


def test_a_kept_launcher_keeps_its_stream_and_kernel(tmp_path, monkeypatch):
    monkeypatch.setitem(_driver._primary_context_addresses, 0, 0xC0)
    launched = []
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    kernel._h_kernel, kernel._function_address, kernel._native_launch = 1, 0xF00, lambda *a: launched.append(a) or 0
    launch = kernel[4, 32, 0, made_up_stream(0x5555)]
    del kernel
    gc.collect()
    launch(array(8), array(16), 1)
    assert launched[0][2] == 0x5555


def test_the_cache_is_bounded(stubbed):
    kernel, launched = stubbed
    limit = _eager_launch.MAX_LAUNCH_CONFIGS
    streams = [made_up_stream(0x10000 + i) for i in range(3 * limit)]
    for i, stream in enumerate(streams):
        kernel[1 + i, 32, 0, stream](array(8), array(16), 1)
        kernel[1 + i, 32](array(8), array(16), 1)
        kernel.launch(array(8), array(16), 1, grid=1 + i, block=64, stream=stream)
        assert len(kernel._launch_configs) <= limit and len(kernel._geometries) <= limit
    assert [call[2:4] for call in launched[-3:]] == [(int(streams[-1]), geo(3 * limit, 32)),
                                                     (0x10, geo(3 * limit, 32)), (int(streams[-1]), geo(3 * limit, 64))]


class FakeCapture:
    """Records what a launch tells the capture on its stream."""
    def __init__(self):
        self.notes, self.kernels = [], []

    def note(self, label, where, array, written=False):
        self.notes.append((label, where, array.ptr, written))

    def note_kernel(self, handles, flags, kernel=None):
        self.kernels.append((tuple(handles), flags, kernel))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("on_stream", [False, True], ids=["current", "stream"])
def test_while_a_capture_is_underway_each_form_tells_it_what_the_launch_uses(stubbed, monkeypatch, form, on_stream):
    """Launched before, during and after a capture elsewhere: the capture hears of each launch on its stream."""
    kernel, launched = stubbed
    stream = made_up_stream(0x9999) if on_stream else None
    capture = FakeCapture()
    capturing = 0x9999 if on_stream else 0x10  # the stream the capture is on
    monkeypatch.setattr(_captures, "capture_on", lambda s: capture if int(s) == capturing else None)
    monkeypatch.setattr(_driver, "ensure_context", lambda device=None: 0)
    monkeypatch.setitem(kernel._functions, 0, 0xF0F)  # the CUfunction in device 0's context
    y, x = array(0x1000), array(0x2000)
    FORMS[form](kernel, 4, 32, 0, stream, (y, x, 1))  # kept and made ready before the capture
    monkeypatch.setitem(_captures.streams_capturing, ("elsewhere", 0), object())
    FORMS[form](kernel, 4, 32, 0, stream, (y, x, 2))
    FORMS[form](kernel, 8, 32, 0, stream, (y, x, 3))  # a new configuration during the capture
    monkeypatch.delitem(_captures.streams_capturing, ("elsewhere", 0))
    FORMS[form](kernel, 4, 32, 0, stream, (y, x, 4))
    assert [words(y, x, n) for n in (1, 2, 3, 4)] == [call[4] for call in launched]
    assert [call[3] for call in launched] == [geo(4, 32), geo(4, 32), geo(8, 32), geo(4, 32)]
    # add_one(float* y, const float* x, int n): y may be written, x only read
    assert capture.notes == [("y", "kernel add_one", 0x1000, True), ("x", "kernel add_one", 0x2000, False)] * 2
    assert capture.kernels == [((0xF00, 0xF0F), kernel._flags, kernel)] * 2


# ---------------------------------------------------------------------------
# CPU: errors, the same in every form, before and after a configuration is kept
# ---------------------------------------------------------------------------

BAD_CONFIGS = [  # (grid, block, shared_mem, stream) -> error
    ((0, 32, 0, None), ValueError, "grid dimensions must be >= 1"),
    ((16.0, 32, 0, None), TypeError, "grid must be an int"),
    ((True, 32, 0, None), TypeError, "grid must be an int"),
    ((1, 32.0, 0, None), TypeError, "block must be an int"),
    ((1, (1, 2, 3, 4), 0, None), TypeError, "block must be an int or a tuple"),
    ((2**32, 32, 0, None), ValueError, "must each fit in 32 bits"),
    ((1, 32, -1, None), ValueError, "shared_mem must be >= 0"),
    ((1, 32, 1.5, None), TypeError, "shared_mem must be an int"),
    ((1, 32, 0.0, None), TypeError, "shared_mem must be an int"),
    ((1, 32, False, None), TypeError, "shared_mem must be an int"),
    ((1, 32, 0, 5), TypeError, "stream must be a jaxgraph.Stream, got int"),
    ((1, 32, 0, "s"), TypeError, "stream must be a jaxgraph.Stream, got str"),
]


def _bad_config_calls(kernel, grid, block, shared_mem, stream, args):
    """Every form's way of meeting the configuration: indexing (then launching), and kernel.launch."""
    yield lambda: kernel[grid, block, shared_mem, stream]
    if stream is None:
        yield lambda: kernel[grid, block, shared_mem](*args)
        if shared_mem == 0 and type(shared_mem) is int:
            yield lambda: kernel[grid, block](*args)
    yield lambda: kernel.launch(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)


@pytest.mark.parametrize("config, exc, message", BAD_CONFIGS)
@pytest.mark.parametrize("on_stream", [False, True], ids=["current", "stream"])
@pytest.mark.parametrize("kept", [False, True], ids=["new", "after-an-equal-kept"])
def test_bad_configurations_raise_in_every_form(stubbed, config, exc, message, on_stream, kept):
    kernel, launched = stubbed
    args = (array(8), array(16), 1)
    grid, block, shared_mem, stream = config
    if on_stream and stream is None:
        stream = made_up_stream(0x7777)
    if kept:  # the plain-int configuration equal to the bad one (16.0 == 16, True == 1, 0.0 == 0) is kept first
        plain = tuple(int(v) if isinstance(v, (bool, float)) else v for v in (grid, block, shared_mem))
        if all(type(v) is int and 0 <= v < 2**32 for v in plain) and plain[0] >= 1:
            good_stream = stream if isinstance(stream, Stream) else None
            kernel[plain + (good_stream,)](*args)
            kernel[plain](*args)
            kernel.launch(*args, grid=plain[0], block=plain[1], shared_mem=plain[2], stream=good_stream)
            if plain[2] == 0:
                kernel[plain[:2]](*args)
            assert kernel._launch_configs
    before = len(launched)
    for call in _bad_config_calls(kernel, grid, block, shared_mem, stream, args):
        with pytest.raises(exc, match=message):
            call()
    assert len(launched) == before


@pytest.mark.parametrize("config", [1, (1,), (1, 2, 3, None, 5), [1, 32]])
def test_a_config_that_is_not_a_tuple_of_two_to_four(stubbed, config):
    with pytest.raises(TypeError, match=r"use kernel\[grid, block\]"):
        stubbed[0][config]


BAD_ARGS = [
    ((array(8), array(16)), "takes 3 arguments"),
    ((array(8), array(16, np.float64), 1), r"parameter x is const float\*, got an array of float64"),
    ((array(8), array(16), 2**31), "parameter n is int, 2147483648 is out of its range"),
    ((array(8), array(16), 1.5), "parameter n is int"),
    ((array(8), np.zeros(4, np.float32), 1), r"got ndarray \(host memory\)"),
    ((123, array(16), 1), "takes a device array, got int"),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("on_stream", [False, True], ids=["current", "stream"])
def test_bad_arguments_raise_in_every_form_before_the_driver(stubbed, form, on_stream):
    kernel, launched = stubbed
    stream = made_up_stream(0x8888) if on_stream else None
    FORMS[form](kernel, 4, 32, 0, stream, (array(8), array(16), 1))  # kinds learned, configuration kept
    for args, message in BAD_ARGS:
        with pytest.raises(TypeError, match=message):
            FORMS[form](kernel, 4, 32, 0, stream, args)
    assert len(launched) == 1


# ---------------------------------------------------------------------------
# GPU: every form against numpy
# ---------------------------------------------------------------------------

GPU_FORMS = ["bound-stream", "bound-current", "index-stream", "index-current", "launch-stream", "launch-current"]


@pytest.mark.gpu
@pytest.mark.parametrize("form", GPU_FORMS)
def test_every_form_matches_numpy(rng, form):
    """Poisoned outputs, fresh inputs, sizes and streams that change (a stream dropped and made anew): exact."""
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one")
    how, where = form.split("-")
    streams = [jaxgraph.Stream(), jaxgraph.Stream()]
    bound = {}
    for i in range(12):
        n = int(rng.integers(1, 3 * N))
        block = [128, 256, 1024][i % 3]
        grid = (n + block - 1) // block
        if i == 6:  # a new stream, perhaps at the dropped one's id
            streams[0].synchronize()
            streams[0] = jaxgraph.Stream()
            bound.clear()
        stream = streams[i % 2] if where == "stream" else None
        x = rng.standard_normal(n).astype(np.float32)
        y = jaxgraph.asarray(np.full(n, np.nan, np.float32))
        x_d = jaxgraph.asarray(x)
        jaxgraph.synchronize()
        if how == "bound":
            key = (grid, block, i % 2)
            launch = bound.setdefault(key, kernel[grid, block, 0, stream] if stream else kernel[grid, block])
            launch(y, x_d, n)
        elif how == "index":
            (kernel[grid, block, 0, stream] if stream else kernel[grid, block])(y, x_d, n)
        else:
            kernel.launch(y, x_d, n, grid=grid, block=block, stream=stream)
        jaxgraph.synchronize()
        np.testing.assert_array_equal(y.numpy(), x + np.float32(1), err_msg=f"{form}, launch {i}, n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("form", GPU_FORMS)
def test_every_form_raises_and_uses_the_shared_memory_limit(rng, form):
    """64 KiB of dynamic shared memory (over the default 48 KiB), twice in each form: raised, then used."""
    kernel = jaxgraph.Kernel(REVERSE_BLOCK, "reverse_block")
    how, where = form.split("-")
    stream = jaxgraph.Stream() if where == "stream" else None
    block, per_block = 1024, 1024 * 16
    n = per_block * 3
    bound = kernel[3, block, per_block * 4, stream]
    for _ in range(2):
        x = rng.standard_normal(n).astype(np.float32)
        x_d = jaxgraph.asarray(x)
        y = jaxgraph.asarray(np.full(n, np.nan, np.float32))
        jaxgraph.synchronize()
        if how == "bound":
            bound(y, x_d, n)
        elif how == "index":
            kernel[3, block, per_block * 4, stream](y, x_d, n)
        else:
            kernel.launch(y, x_d, n, grid=3, block=block, shared_mem=per_block * 4, stream=stream)
        jaxgraph.synchronize()
        np.testing.assert_array_equal(y.numpy(), x.reshape(3, per_block)[:, ::-1].ravel())
