"""One captured graph per GPU, replayed inside jax.shard_map and jax.pmap.

Run:  python examples/several_gpus.py

1. Capture the same kernel sequence on every local GPU with
   jaxgraph.capture_per_device: each GPU gets its own graph, memory pool and
   static arrays.
2. Use it inside jax.shard_map over a mesh of those GPUs, between XLA ops
   and a psum: each GPU replays its own graph on its own shard. Check
   against numpy.
3. The same graphs under jax.pmap.

With one GPU the mesh has one device; on a machine without a CUDA GPU it says
so in one line and exits 0.
"""

import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPUs with jaxgraph

import numpy as np

import jaxgraph

SOURCE = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void add_one(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
}
"""


def reference(x: np.ndarray) -> np.ndarray:
    """What each GPU's graph computes on its shard: y = 0.5 x, then y += 1 ninety-nine times."""
    y = np.float32(0.5) * x
    for _ in range(99):
        y = y + np.float32(1)
    return y


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("CUDA GPUs are needed to replay graphs on several devices: none found, so this example stops here")
        return 0
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    n, block = 1 << 16, 256  # elements per GPU (one shard)
    blocks = (n + block - 1) // block
    scale = jaxgraph.Kernel(SOURCE, "scale")
    add_one = jaxgraph.Kernel(SOURCE, "add_one")

    # 1. Called once per GPU with that GPU current and a static input on it;
    #    the output comes from that GPU's graph pool.
    def step(x):
        y = jaxgraph.empty(x.shape)
        scale[blocks, block](y, x, 0.5, n)
        for _ in range(99):
            add_one[blocks, block](y, n)
        return y

    gpus = jax.local_devices(backend="gpu")
    sg = jaxgraph.capture_per_device(step, [jax.ShapeDtypeStruct((n,), jnp.float32)], devices=gpus)
    print(f"captured one 100-launch graph on each of {len(gpus)} GPU(s): devices {sg.devices}")

    # 2. Inside shard_map: every GPU replays its own graph on its shard, in
    #    stream order with the XLA ops around it.
    mesh = Mesh(np.array(gpus), ("x",))

    def body(x):
        y = sg(x * 2.0 - 1.0)
        return y - 99.0, jax.lax.psum(jnp.sum(y), "x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
    rng = np.random.default_rng()
    for _ in range(3):  # fresh inputs each call
        x = rng.standard_normal(n * len(gpus)).astype(np.float32)
        y, total = f(jax.device_put(x, NamedSharding(mesh, P("x"))))
        want = reference(x * 2 - 1)
        np.testing.assert_allclose(np.asarray(y), want - 99, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(float(total), want.sum(dtype=np.float64), rtol=1e-4)
    print(f"shard_map over {len(gpus)} GPU(s), {n} floats per GPU: matches numpy")

    # 3. pmap maps the leading axis over the GPUs: one row per GPU.
    rows = rng.standard_normal((len(gpus), n)).astype(np.float32)
    got = np.asarray(jax.pmap(sg, devices=gpus)(rows))
    np.testing.assert_allclose(got, reference(rows), rtol=1e-5, atol=1e-5)
    print(f"pmap over {len(gpus)} GPU(s): matches numpy")
    sg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
