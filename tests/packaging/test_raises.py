"""The exceptions the public API raises are the ones its docstrings' ``Raises`` sections name.

Each case makes a wrong call that needs no GPU and names the documented
function: the exception must be of a type listed in that function's
``Raises`` section (or a subclass of one). Argument errors come before state
errors: a wrong call on a graph that captured nothing says what is wrong with
the call.

Tests internals (listed in tests/README.md): ``internals.spec_replayable``,
``internals.spec_sharded``, ``Stream._setup``; documented exceptions of replayables and sharded
graphs raised on a CPU.
"""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import null_array
from support.internals import spec_replayable, spec_sharded
from support.kernel_sources import SAXPY


def documented(fn) -> set[str]:
    """The exception names in ``fn``'s NumPy-style ``Raises`` section."""
    lines = (fn.__doc__ or "").splitlines()
    starts = [i for i, line in enumerate(lines[:-1])
              if line.strip() == "Raises" and re.fullmatch(r"\s*-+\s*", lines[i + 1])]
    assert starts, f"{fn.__qualname__} has no Raises section"
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    names = set()
    rest = lines[starts[0] + 2:]
    for i, line in enumerate(rest):
        if not line.strip() or len(line) - len(line.lstrip()) > indent:
            continue  # a blank line, or an exception's description
        next_line = rest[i + 1] if i + 1 < len(rest) else ""
        if line.lstrip().startswith("..") or re.fullmatch(r"\s*-+\s*", next_line):
            break  # a directive, or the next section
        names.add(line.strip().rsplit(".", 1)[-1])
    return names


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def ffi_step():
    """A replayable with no graph behind it (``via="ffi"``, float32[4] -> float32[4])."""
    return spec_replayable((sds(4),), (sds(4),), 7)


def closed_step():
    step = ffi_step()
    step.close()
    return step


def sharded():
    return spec_sharded(ffi_step(), [0])


def never_called(*args):
    raise AssertionError("called before the arguments were checked")


def foreign_array():
    return null_array((4,), np.float32)


def fake_stream():
    s = jaxgraph.Stream.__new__(jaxgraph.Stream)
    s._setup(5, 0, owner=None, owned=False)
    return s


@pytest.fixture(scope="module")
def saxpy(tmp_path_factory):
    return jaxgraph.Kernel(SAXPY, "saxpy", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


X = np.zeros(8, np.float32)
R = jaxgraph.replayable
MGC = jaxgraph.make_graphed_callables
CPD = jaxgraph.capture_per_device

CASES = [
    # replayable: arguments first, then the graph's state
    (R, lambda: R(jaxgraph.CUDAGraph(), inputs=[], outputs=[]), ValueError, "at least one output"),
    (R, lambda: R(jaxgraph.CUDAGraph(), [], [], backward=3), TypeError, "backward must be callable"),
    (R, lambda: R(jaxgraph.CUDAGraph(), [], [], input_output_aliases=[(0, 0)]), TypeError,
     "input_output_aliases must be a dict"),
    (R, lambda: R(jaxgraph.CUDAGraph(), [], [], input_output_aliases={0: 0}), ValueError,
     "does not name an input and an output"),
    (R, lambda: R(jaxgraph.CUDAGraph(), [], [], via="host"), ValueError, "via must be one of"),
    (R, lambda: R("graph", [], [np.zeros(3)]), TypeError, r"outputs\[0\] must be a device array"),
    (R, lambda: R("graph", [], []), TypeError, "graph must be a captured"),
    # add_device: arguments first, then whether the replayable is alive
    (jaxgraph.Replayable.add_device, lambda: ffi_step().add_device("graph", [], []), TypeError,
     "graph must be a captured"),
    (jaxgraph.Replayable.add_device, lambda: closed_step().add_device(jaxgraph.CUDAGraph(), [], []), ValueError,
     "at least one output"),
    (jaxgraph.Replayable.add_device, lambda: closed_step().add_device(jaxgraph.CUDAGraph(), [], 5), TypeError,
     "outputs must be a list"),
    # make_graphed_callables
    (MGC, lambda: MGC((never_called,), ((X,),), backward=(never_called, None)), ValueError,
     "backward must be a tuple with one entry .* got 2 entries"),
    (MGC, lambda: MGC((never_called, never_called), ((X,), (X,)), backward=never_called), TypeError,
     "backward must be a tuple"),
    (MGC, lambda: MGC(never_called, (X,), backward=7), TypeError, "must be callable or None"),
    (MGC, lambda: MGC(((never_called, never_called),), ((X,),), backward=(never_called,)), ValueError,
     r"pair and backward\[0\] is given too"),
    (MGC, lambda: MGC(never_called, (X,), num_warmup_iters=1.5), TypeError, "num_warmup_iters must be an int"),
    (MGC, lambda: MGC(never_called, (X,), allow_unused_input="yes"), TypeError, "allow_unused_input must be"),
    (MGC, lambda: MGC(never_called, (X,), pool="mine"), TypeError, "pool must be a token"),
    (MGC, lambda: MGC(never_called, (X,), pool=(0, 10**9)), ValueError, "no longer exists"),
    (MGC, lambda: MGC(never_called, (X,), capture_error_mode="often"), ValueError, "capture_error_mode"),
    # capture_per_device: every argument before any device work
    (CPD, lambda: CPD(3, [sds(4)]), TypeError, "fn must be callable"),
    (CPD, lambda: CPD(never_called, [sds(4)], backward=3), TypeError, "backward must be callable"),
    (CPD, lambda: CPD(never_called, sds(4)), TypeError, "in_shapes must be a list"),
    (CPD, lambda: CPD(never_called, [(4,)]), TypeError, r"in_shapes\[0\] must have a shape"),
    (CPD, lambda: CPD(never_called, [sds(4)], bind="never"), ValueError, "bind must be one of"),
    (CPD, lambda: CPD(never_called, [sds(4)], capture_error_mode="often"), ValueError, "capture_error_mode"),
    (CPD, lambda: CPD(never_called, [sds(4)], input_output_aliases=[(0, 0)]), TypeError,
     "input_output_aliases must be a dict"),
    (CPD, lambda: CPD(never_called, [sds(4)], input_output_aliases={1: 0}), ValueError,
     r"1 -> 0 does not name an input \(of 1\)"),
    (CPD, lambda: CPD(never_called, [sds(4)], devices=object()), TypeError, "devices must be a Mesh"),
    (CPD, lambda: CPD(never_called, [sds(4)], devices=[]), ValueError, "devices is empty"),
    (CPD, lambda: CPD(never_called, [sds(4)], devices=[0, 0]), ValueError, "given more than once"),
    (CPD, lambda: CPD(never_called, [sds(4)], devices=[-1]), ValueError, "ordinal is >= 0"),
    # ShardedGraph
    (jaxgraph.ShardedGraph.check_devices, lambda: sharded().check_devices(object()), TypeError, "devices must be a Mesh"),
    (jaxgraph.ShardedGraph.check_devices, lambda: sharded().check_devices([1]), ValueError, "no graph for device 1"),
    # CUDAGraph.capture_begin: arguments before the driver
    (jaxgraph.CUDAGraph.capture_begin, lambda: jaxgraph.CUDAGraph().capture_begin(pool="mine"), TypeError,
     "pool must be a token"),
    (jaxgraph.CUDAGraph.capture_begin, lambda: jaxgraph.CUDAGraph().capture_begin(pool=(0, 10**9)), ValueError,
     "no longer exists"),
    (jaxgraph.CUDAGraph.capture_begin, lambda: jaxgraph.CUDAGraph().capture_begin(capture_error_mode="x"),
     ValueError, "capture_error_mode"),
    # DeviceArray.record_stream
    (jaxgraph.DeviceArray.record_stream, lambda: foreign_array().record_stream(0), TypeError, "expects a jaxgraph.Stream"),
    (jaxgraph.DeviceArray.record_stream, lambda: foreign_array().record_stream(fake_stream()), ValueError,
     "applies to memory jaxgraph allocated"),
    # Kernel
    (jaxgraph.Kernel, lambda: jaxgraph.Kernel(123, "axpy", arch="sm_90"), TypeError, "source must be"),
    (jaxgraph.Kernel, lambda: jaxgraph.Kernel(SAXPY, "", arch="sm_90"), TypeError, "name must be"),
    (jaxgraph.Kernel, lambda: jaxgraph.Kernel(SAXPY, "saxpy", options=5, signature="float* y", arch="sm_90"),
     TypeError, "options must be"),
    (jaxgraph.Kernel, lambda: jaxgraph.Kernel(SAXPY, "nothing", arch="sm_90"), ValueError, "no __global__"),
]


@pytest.mark.parametrize("fn, call, exc, match", CASES,
                         ids=[f"{c[0].__qualname__}-{i}" for i, c in enumerate(CASES)])
def test_wrong_calls_raise_a_documented_exception(fn, call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    names = {cls.__name__ for cls in type(info.value).__mro__}
    assert names & documented(fn), (f"{fn.__qualname__} raised {type(info.value).__name__}; its Raises "
                                    f"section names {sorted(documented(fn))}")


JAX_CALL_CASES = [
    (dict(shared_mem=-1), ValueError, "shared_mem must be >= 0"),
    (dict(shared_mem="a"), TypeError, "shared_mem must be an int"),
    (dict(inout=5), TypeError, "inout must be a sequence"),
    (dict(inout=("a",)), ValueError, "not a pointer"),
    (dict(block=(16, 16)), ValueError, "grid= is required"),
    (dict(block=0), ValueError, "dimensions must be >= 1"),
    (dict(block="x"), TypeError, "block must be an int"),
]


@pytest.mark.parametrize("options, exc, match", JAX_CALL_CASES)
def test_jax_call_errors_are_documented(saxpy, options, exc, match):
    x = jnp.zeros(8, jnp.float32)
    with pytest.raises(exc, match=match) as info:
        jax.jit(lambda x: saxpy.jax_call(sds(8), x, 1.0, 8, **options)).trace(x)
    assert type(info.value).__name__ in documented(jaxgraph.Kernel.jax_call)


def test_the_raises_parser_reads_a_numpy_section():
    def f():
        """Do.

        Raises
        ------
        TypeError
            Bad type.
        jaxgraph.CudaError
            Bad call.

        Notes
        -----
        ValueError
            Not a raise.
        """

    assert documented(f) == {"TypeError", "CudaError"}
    assert documented(jaxgraph.replayable) == {"TypeError", "ValueError", "RuntimeError"}
    assert documented(jaxgraph.Kernel) == {"TypeError", "CompileError", "ValueError"}
    assert documented(types.SimpleNamespace(__doc__="x\n\nRaises\n------\nKeyError\n    k.\n",
                                            __qualname__="g")) == {"KeyError"}
