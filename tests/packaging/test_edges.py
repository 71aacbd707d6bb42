"""First-use edges that need no GPU: clear errors for common mistakes, and where things go.

Each case here is something a new user hits: a template named without its
arguments, a non-string source, a missing CUDA header, a non-bool flag, JAX
without CUDA. The message must name the cause and the fix.

Tests internals (listed in tests/README.md): ``internals.spec_replayable`` (one test); a replay
compiled for JAX's CPU backend names the fix; no GPU to capture a graph on.
"""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.kernel_sources import ADD_ONE, AXPY


def test_template_named_without_arguments_says_to_instantiate_it(tmp_path):
    with pytest.raises(ValueError, match=r"kernel 'axpy' is a template: name an instance of it, such as 'axpy<float>'"):
        jaxgraph.Kernel(AXPY, "axpy", arch="sm_90", cache_dir=tmp_path)


@pytest.mark.parametrize("source, name, message", [
    (123, "axpy", "source must be a non-empty string of CUDA C\\+\\+, got int"),
    ("  ", "axpy", "source must be a non-empty string"),
    (AXPY, 5, "name must be the kernel's name as a string, got 5"),
])
def test_kernel_arguments_are_type_checked(source, name, message):
    with pytest.raises(TypeError, match=message):
        jaxgraph.Kernel(source, name, arch="sm_90")


def test_missing_header_says_where_cuda_headers_come_from(tmp_path):
    src = '#include <no_such_cuda_header.h>\n' + ADD_ONE
    with pytest.raises(jaxgraph.CompileError, match=r"(?s)cannot open source file.*CUDA headers such as <cuda_fp16.h> come from"):
        jaxgraph.Kernel(src, "add_one", arch="sm_90", cache_dir=tmp_path)


def test_missing_cccl_header_says_cccl_not_the_runtime_wheel(tmp_path):
    src = '#include <cuda/std/cstdint>\n' + ADD_ONE
    with pytest.raises(jaxgraph.CompileError) as info:
        jaxgraph.Kernel(src, "add_one", arch="sm_90", cache_dir=tmp_path, options={"include_path": [str(tmp_path)]})
    message = str(info.value)
    assert 'cannot open source file "cuda/std/cstdint"' in message
    assert "are CCCL's headers, which the nvidia-cuda-runtime wheel lacks" in message
    assert 'pip install "nvidia-cuda-cccl>=13,<14"' in message
    assert "CUDA headers such as <cuda_fp16.h>" not in message  # not the runtime wheel's hint


def test_an_unwritable_cache_dir_warns_once_saying_where(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    where = blocker / "kernels"  # under a file: mkdir fails whoever runs the test (root too)
    with pytest.warns(RuntimeWarning, match=r"jaxgraph cannot write its kernel cache at .*a_file/kernels") as seen:
        first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=where)
    assert len([w for w in seen if "kernel cache" in str(w.message)]) == 1
    assert first.cache_path is None and not first.cache_hit
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second kernel, same directory: compiled again, no second warning
        again = jaxgraph.Kernel(ADD_ONE.replace("1.0f", "2.0f"), "add_one", arch="sm_90", cache_dir=where)
    assert again.cache_path is None and again.cubin != first.cubin


def test_a_replayable_s_repr_says_when_no_path_is_known_yet():
    from support.internals import spec_replayable

    step = spec_replayable((jax.ShapeDtypeStruct((4,), jnp.float32),), (jax.ShapeDtypeStruct((4,), jnp.float32),), 7)
    text = repr(step)
    assert not text.endswith("paths=>"), text
    assert text.endswith("via=ffi graph=7 alive paths=none (no graph registered)>"), text


def test_a_replay_on_jax_s_cpu_suggests_via_callback_only_where_a_gpu_exists():
    from support.internals import spec_replayable

    step = spec_replayable((jax.ShapeDtypeStruct((4,), jnp.float32),), (jax.ShapeDtypeStruct((4,), jnp.float32),), 7)
    x = jax.device_put(np.zeros(4, np.float32), jax.devices("cpu")[0])
    with pytest.raises(Exception, match="jaxgraph_replay .*runs on JAX's CUDA backend") as info:
        jax.block_until_ready(jax.jit(step)(x))
    message = str(info.value)
    if jaxgraph.device_count() > 0:  # a GPU with JAX on the CPU: the host-callback path works here
        assert 'build the replayable with via="callback", which replays from the host' in message
    else:
        assert "this machine has no CUDA device either" in message
        assert 'however it is called (via="callback" too)' in message
        assert "build the replayable with via" not in message
        assert 'lower(lowering_platforms=("cuda",))' in message


def test_a_conditional_graph_s_instantiation_failure_says_what_cuda_said():
    from jaxgraph.diagnostics import native_module

    failure = native_module("replay").conditional_instantiate_failure
    not_supported, invalid_value, out_of_memory = 801, 1, 2  # cudaError_t
    assert failure(not_supported, True) == ""  # CUDA's one-executable rule: the CUDAGraph's executable is shared
    assert "CUDA allows one executable of such a graph" in failure(not_supported, False)
    assert "cudaErrorNotSupported" in failure(not_supported, False)
    for err, name in [(invalid_value, "cudaErrorInvalidValue"), (out_of_memory, "cudaErrorMemoryAllocation")]:
        for borrowed in (True, False):
            text = failure(err, borrowed)
            assert f"cudaGraphInstantiate failed with {name}" in text
            assert "one executable" not in text  # not reported as the one-executable rule


def test_a_stream_speaks_the_cuda_stream_protocol():
    """What CuPy's Stream.from_external (and cuda.core) read: version 0 and the stream's address."""
    stream = jaxgraph.Stream.__new__(jaxgraph.Stream)
    stream._setup(0x1234, 0, None, False)
    assert stream.__cuda_stream__() == (0, 0x1234) == (0, int(stream))


@pytest.mark.parametrize("value", ["no", 1, None])
def test_keep_graph_must_be_a_bool(value):
    with pytest.raises(TypeError, match="keep_graph must be a bool"):
        jaxgraph.CUDAGraph(keep_graph=value)


def test_kernel_cache_honours_xdg_cache_home(tmp_path):
    code = ("import jaxgraph; k = jaxgraph.Kernel(open(0).read(), 'add_one', arch='sm_90'); "
            "print(k.cache_path)")
    env = {key: value for key, value in os.environ.items() if key != "JAXGRAPH_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], input=ADD_ONE, capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert pathlib.Path(out).parent == tmp_path / "jaxgraph" / "kernels"
    assert pathlib.Path(out).is_file()


def test_jax_call_compiled_for_the_cpu_says_jaxgraph_needs_cuda():
    k = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90" if not jaxgraph.device_count() else None)
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(np.arange(8, dtype=np.float32), cpu)
    f = jax.jit(lambda x: k.jax_call(jax.ShapeDtypeStruct((8,), jnp.float32), x, 8))
    with jax.default_device(cpu):
        with pytest.raises(Exception, match=r'(?s)jaxgraph_launch.*runs on JAX\'s CUDA backend.*pip install "jax\[cuda13\]"'):
            jax.block_until_ready(f(x))


def test_replayable_compiled_for_the_cpu_suggests_the_callback_path():
    from support.internals import spec_replayable

    sds = jax.ShapeDtypeStruct((8,), jnp.float32)
    step = spec_replayable((sds,), (sds,), graph_id=123456)
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(np.arange(8, dtype=np.float32), cpu)
    with jax.default_device(cpu):
        with pytest.raises(Exception, match=r'(?s)jaxgraph_replay.*jax\[cuda13\].*via="callback"'):
            jax.block_until_ready(jax.jit(step)(x))
