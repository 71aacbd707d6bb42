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
from kernels import ADD_ONE, AXPY


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
    from internals import spec_replayable

    sds = jax.ShapeDtypeStruct((8,), jnp.float32)
    step = spec_replayable((sds,), (sds,), graph_id=123456)
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(np.arange(8, dtype=np.float32), cpu)
    with jax.default_device(cpu):
        with pytest.raises(Exception, match=r'(?s)jaxgraph_replay.*jax\[cuda13\].*via="callback"'):
            jax.block_until_ready(jax.jit(step)(x))
