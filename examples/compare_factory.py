"""A factory for ``python -m jaxgraph.compare``: one loop written three ways (docs/guide/compare.md).

    python -m jaxgraph.compare examples/compare_factory.py:make_case --rounds 5 --compare-functions

The loop runs ``steps`` times the step ``u <- u / 2 + 1`` on ``n`` floats:

  jnp          the step in jax.numpy inside lax.fori_loop: what a JAX user writes
  jax_call     the same step as a CUDA kernel through Kernel.jax_call, in lax.fori_loop (GPU)
  device loop  that kernel captured once, run ``steps`` times by one graphed_loop, in jax.jit (GPU)

All three compute the same numbers (the halving is exact, so a fused multiply-add
changes nothing): the comparison checks each against itself under every XLA
setting, and with ``--compare-functions`` against the ``jnp`` loop too.
Without a GPU the factory returns the ``jnp`` loop alone: the other two run CUDA
kernels. Every worker process calls the factory itself, so the input comes from a
fixed seed: each setting gets the same numbers.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxgraph

DECAY = r"""
extern "C" __global__ void decay(float* u_next, const float* u, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) u_next[i] = 0.5f * u[i] + 1.0f;
}
"""


def jnp_loop(u, steps):
    """``steps`` steps of ``u / 2 + 1`` in jax.numpy, in a ``lax.fori_loop``."""
    return jax.lax.fori_loop(0, steps, lambda i, v: 0.5 * v + 1.0, u)


def make_case(n: int = 4096, steps: int = 1000) -> dict:
    """``{label: (fn, args)}``: the jnp loop, and with a GPU the kernel's two loops."""
    u0 = np.random.default_rng(0).random(n, dtype=np.float32)
    cases = {"jnp": (lambda u: jnp_loop(u, steps), (jnp.asarray(u0),))}
    if jaxgraph.device_count() > 0:
        cases.update(kernel_cases(u0, steps))
    return cases


def kernel_cases(u0: np.ndarray, steps: int) -> dict:
    """The same loop with the CUDA kernel: through ``jax_call`` in ``fori_loop``, and as a device loop."""
    n = u0.size
    grid = (n + 255) // 256
    decay = jaxgraph.Kernel(DECAY, "decay")

    def kernel_loop(u):
        step = lambda i, v: decay.jax_call(jax.ShapeDtypeStruct(v.shape, v.dtype), v, n)  # noqa: E731
        return jax.lax.fori_loop(0, steps, step, u)

    def advance(u):  # one step, captured once by make_graphed_callables
        u_next = jaxgraph.empty(u.shape)
        decay[grid, 256](u_next, u, n)
        return u_next

    graphed = jaxgraph.make_graphed_callables(advance, (jaxgraph.asarray(u0),))
    loop = jaxgraph.graphed_loop(graphed, steps, feed={0: 0})  # output 0 feeds input 0
    u = jnp.asarray(u0)
    return {"jax_call": (kernel_loop, (u,)), "device loop": (lambda u: loop(u), (u,))}


if __name__ == "__main__":  # a helper module: run, it says what it is and where the example is
    print('examples/compare_factory.py is a factory for python -m jaxgraph.compare, not an example: run python -m jaxgraph.compare examples/compare_factory.py:make_case')
