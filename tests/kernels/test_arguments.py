"""One table of wrong kernel arguments, checked against both paths that encode arguments.

An eager launch (``kernel[grid, block](...)``) and a call inside ``jax.jit``
(``Kernel.jax_call``) check and encode arguments with the same code
(``jaxgraph/_kernels/signature.py``), so the same mistake must give the same message on
both, before anything reaches a GPU (these tests need none).

Tests internals (listed in tests/README.md): ``Kernel._packer.values``, ``_kernels.signature.scalar_word``;
eager launches and `jax_call` must encode each scalar to the same bytes; the encoder has no
public face.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import null_array
from support.kernel_sources import AXPY


# Placeholders each path turns into its own kind of array.
Y, X, XI = "output float32[8]", "input float32[8]", "input int32[8]"

CASES = [
    ((Y, X, 1.0), r"axpy<float> takes 4 arguments \(y, x, a, n\), got 3"),
    ((Y, X, 1.0, 8, 9), r"axpy<float> takes 4 arguments \(y, x, a, n\), got 5"),
    ((Y, XI, 1.0, 8), r"parameter x is const float\*, got an array of int32"),
    ((Y, 3.0, 1.0, 8), r"parameter x \(const float\*\) takes a device array, got float"),
    ((Y, "x", 1.0, 8), r"parameter x \(const float\*\) takes a device array, got str"),
    ((Y, X, 1.0, 8.5), "parameter n is int, got float 8.5"),
    ((Y, X, 1.0, "8"), "parameter n is int, got str '8'"),
    ((Y, X, 1.0, 2**31), r"parameter n is int, 2147483648 is out of its range \[-2147483648, 2147483647\]"),
    ((Y, X, 1.0, -2**31 - 1), "-2147483649 is out of its range"),
    ((Y, X, np.float64(1.0), 8), r"parameter a is float \(float32\), got a numpy float64 scalar"),
    ((Y, X, 1.0, np.int64(8)), r"parameter n is int \(int32\), got a numpy int64 scalar"),
    ((Y, X, True, 8), "parameter a is float, got bool"),
    ((Y, X, 1.0, True), r"parameter n is int, got bool True; pass 1 \(an int\) if you mean it"),
    ((Y, X, 1.0, np.bool_(False)), r"parameter n is int \(int32\), got a numpy bool scalar"),
    ((Y, X, "2", 8), "parameter a is float, got str"),
    ((Y, X, 1e40, 8), r"parameter a is float, got float 1e\+40 \(.*too large"),
    ((Y, X, jnp.float32(1.0), 8), "parameter a .* is a scalar, which is baked into the launch; got a JAX array"),
]


@pytest.fixture(scope="module")
def axpy(tmp_path_factory):
    return jaxgraph.Kernel(AXPY, "axpy<float>", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


def eager_args(args):
    """DeviceArrays at address 0 for the placeholders: the checks run, nothing launches."""
    table = {Y: null_array((8,), np.float32), X: null_array((8,), np.float32), XI: null_array((8,), np.int32)}
    return tuple(table.get(a, a) if isinstance(a, str) else a for a in args)


def jit_args(args):
    """An output ShapeDtypeStruct and JAX arrays for the placeholders."""
    table = {Y: jax.ShapeDtypeStruct((8,), jnp.float32), X: jnp.zeros(8, jnp.float32),
             XI: jnp.zeros(8, jnp.int32)}
    return tuple(table.get(a, a) if isinstance(a, str) else a for a in args)


@pytest.mark.parametrize("args, message", CASES)
def test_eager_launch_rejects(axpy, args, message):
    with pytest.raises(TypeError, match=message):
        axpy[1, 32](*eager_args(args))


@pytest.mark.parametrize("args, message", CASES)
def test_jax_call_rejects_at_trace_time(axpy, args, message):
    args = jit_args(args)
    with pytest.raises(TypeError, match=message):
        jax.jit(lambda: axpy.jax_call(*args)).trace()


def test_both_paths_encode_scalars_alike(axpy):
    """The same 8-byte words: what the eager launch packs and what jax_call bakes into HLO."""
    import struct

    from jaxgraph._kernels.signature import scalar_word

    a, n = axpy.params[2], axpy.params[3]
    for value, param in ((2.5, a), (np.float32(-0.125), a), (7, n), (-3, n), (np.int32(5), n)):
        values, _ = axpy._packer.values(eager_args((Y, X, value if param is a else 1.0, value if param is n else 8)))
        index = 2 if param is a else 3
        eager_word = struct.unpack("<q", struct.pack("<" + param.pack_format, values[index]))[0]
        assert eager_word == scalar_word("axpy<float>", param, value)
