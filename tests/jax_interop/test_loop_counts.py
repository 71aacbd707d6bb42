"""graphed_loop's negative counts, as its docstring says: a Python int is refused, a device-read count runs nothing.

A count given as a Python int (to ``graphed_loop``, ``replay(steps=)`` or a
call's ``steps=``) outside [0, 2**31) is a ``ValueError`` naming the value;
a count the device reads (an int32 array, a traced ``steps=``) below zero runs
no step. The GPU tests count steps with the step kernel's own counter and
compare the state with numpy.

Tests internals (listed in tests/README.md): ``_graphed_loops._check_count``; the refusal on a CPU,
where the public call needs a captured graph.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph._jax_interop import graphed_loops as _loops
from test_loops import N, k, make_step, ref, run_and_check  # noqa: F401 (k: the kernels fixture)


def test_the_docstring_says_what_the_code_does():
    doc = jaxgraph.graphed_loop.__doc__
    assert "A Python int outside\n        [0, 2**31) is a ``ValueError``" in doc
    assert "a negative\n        count read on the device (an array, a traced ``steps=``) runs nothing" in doc
    for n in (-1, -2**31, 2**31):
        with pytest.raises(ValueError, match=rf"steps must be in \[0, 2\*\*31\), got {n}"):
            _loops._check_count(n)


@pytest.mark.gpu
def test_a_negative_count_read_on_the_device_runs_nothing(k, rng):  # noqa: F811
    s = make_step(k, rng)
    count = jaxgraph.zeros(1, np.int32)
    loop = jaxgraph.graphed_loop(s.g, count, feed={0: 0}, unroll=4, inputs=[s.x, s.b], outputs=[s.y])
    for steps in (5, -1, -2**31, 3):
        count.copy_(np.array([steps], np.int32))
        run_and_check(loop, s, rng, max(steps, 0))
    with pytest.raises(ValueError, match=r"steps must be in \[0, 2\*\*31\), got -1"):
        jaxgraph.graphed_loop(s.g, -1, feed={0: 0}, inputs=[s.x, s.b], outputs=[s.y])


@pytest.mark.gpu
def test_a_negative_traced_count_runs_nothing_and_a_negative_int_is_refused(k, rng):  # noqa: F811
    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, feed={0: 0}, unroll=4, inputs=[s.x, s.b], outputs=[s.y])
    fn = jax.jit(lambda x, b, n: loop(x, b, steps=n) * 1.0)
    b = s.b.numpy()
    for steps in (-3, 4, -1):
        x0 = rng.standard_normal(N).astype(np.float32)
        s.counter.fill_(0)
        jaxgraph.synchronize()
        out = np.asarray(fn(jnp.asarray(x0), jnp.asarray(b), jnp.int32(steps)))
        np.testing.assert_allclose(out, ref(x0, b, max(steps, 0)), rtol=1e-5, atol=1e-6)
        assert int(s.counter.numpy()[0]) == max(steps, 0)
    with pytest.raises(ValueError, match=r"steps must be in \[0, 2\*\*31\), got -2"):
        loop.replay(steps=-2)
    with pytest.raises(ValueError, match=r"steps must be in \[0, 2\*\*31\), got -2"):
        loop(jnp.asarray(b), jnp.asarray(b), steps=-2)
