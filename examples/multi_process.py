"""One process per GPU under jax.distributed, as on a cluster: each captures its own graph.

Run:  python examples/multi_process.py                 # starts one process per GPU itself
      python examples/multi_process.py --processes 2   # two processes, sharing GPU 0 if there is one GPU
      torchrun --nproc-per-node=2 examples/multi_process.py --worker   # or srun, mpirun: see below

1. Every process joins jax.distributed (coordinator, process count, its own
   index) and sees one GPU: the global mesh has one device per process.
2. Each process captures the same kernels on its own GPU with
   jaxgraph.capture_per_device (and a make_graphed_callables step), and
   sg.check_devices(mesh) makes every process agree before anything runs:
   a graph missing on one process, other shapes or other graph ids there are
   the same clear error on every process, instead of a hang in the psum.
3. One jitted shard_map step replays every process's graph on its shard,
   between XLA ops and a psum across processes; each process checks its shard
   and the sum against numpy.
4. Every process ends with a final barrier and jax.distributed.shutdown(),
   so a run that succeeded ends without coordination-service errors (no
   "Connection refused"). JAX's GPU client (jax 0.11.2) still logs one
   warning per process at shutdown, "WatchTasksAsync failed for task N:
   CANCELLED": its watch of the other tasks, cancelled by that shutdown.

What each process needs, from any launcher: the coordinator's address
(MASTER_ADDR, MASTER_PORT), the number of processes (WORLD_SIZE), its index
(RANK), and one GPU (CUDA_VISIBLE_DEVICES, or LOCAL_RANK to pick one of the
host's GPUs). Without those, jax.distributed.initialize() detects SLURM,
Open MPI and others itself (``srun python examples/multi_process.py --worker``).
Started without ``--worker``, this file is its own launcher:
it starts the processes with those variables, on 127.0.0.1 at a free port.
With fewer GPUs than processes they share GPU 0, each with a fraction of its
memory (fine to check the logic, useless for speed). Without a CUDA GPU it
says so in one line and exits 0.
"""

import argparse
import os
import socket
import subprocess
import sys

import numpy as np

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
N = 1 << 16  # floats per process (one shard)


def reference(x: np.ndarray) -> np.ndarray:
    """The step on numpy, in float32 as the kernels do it: y = 0.5 (2x - 1), plus 1 ninety-nine times; 3 y + 1."""
    y = np.float32(0.5) * (x * np.float32(2) - np.float32(1))
    for _ in range(99):
        y = y + np.float32(1)
    return np.float32(3) * y + np.float32(1)


# ---------------------------------------------------------------------------
# Each process
# ---------------------------------------------------------------------------


def worker() -> int:
    import jaxgraph

    if jaxgraph.device_count() == 0:  # before jax.distributed, which would wait for the others
        print("a CUDA GPU is needed for each process: none found, so this worker stops here")
        return 0
    import jax

    initialize()
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    rank, world = jax.process_index(), jax.process_count()
    blocks = (N + 255) // 256
    scale = jaxgraph.Kernel(SOURCE, "scale")
    add_one = jaxgraph.Kernel(SOURCE, "add_one")

    def step(x):  # captured once, on this process's GPU
        y = jaxgraph.empty(x.shape)
        scale[blocks, 256](y, x, 0.5, N)
        for _ in range(99):
            add_one[blocks, 256](y, N)
        return y

    def triple(y):
        z = jaxgraph.empty(y.shape)
        scale[blocks, 256](z, y, 3.0, N)
        add_one[blocks, 256](z, N)
        return z

    # 1-2. Every process captures for its own devices (jax.local_devices()), in the same order:
    #      HLO names a graph by its id, and every process must compile the same program.
    sg = jaxgraph.capture_per_device(step, [jax.ShapeDtypeStruct((N,), jnp.float32)])
    graphed = jaxgraph.make_graphed_callables(triple, (jaxgraph.zeros((N,)),))
    mesh = Mesh(np.array(jax.devices()), ("x",))  # every process's GPU
    sg.check_devices(mesh)  # collective: every process agrees, or every process raises
    bound = [str(b) for rows in sg.bindings.values() for b in rows]
    print(f"process {rank}/{world}: captured on CUDA device {sg.devices[0]} ({jax.local_devices()[0]}), "
          f"graph id {sg.graph_id}; {'; '.join(bound)}", flush=True)

    # 3. One jitted step over the global mesh.
    def body(x):
        z = graphed(sg(x * 2.0 - 1.0))
        return z - 1.0, jax.lax.psum(jnp.sum(z), "x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
    sharding = NamedSharding(mesh, P("x"))
    for k in range(3):  # fresh inputs each call, the same on every process (a seed they share)
        x = np.random.default_rng(int(os.environ.get("EXAMPLE_SEED", "0")) + k).standard_normal(N * world)
        x = x.astype(np.float32)
        z, total = f(jax.make_array_from_process_local_data(sharding, x[rank * N:(rank + 1) * N]))
        want = reference(x)
        (shard,) = z.addressable_shards  # this process's part of the global result
        np.testing.assert_allclose(np.asarray(shard.data), want[rank * N:(rank + 1) * N] - 1, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(float(total), want.sum(dtype=np.float64), rtol=1e-4)
    print(f"process {rank}/{world}: shard_map step over {world} processes ({N} floats each, psum across "
          "processes): matches numpy", flush=True)
    sg.close()
    finish()
    return 0


def finish() -> None:
    """A final barrier, then jax.distributed.shutdown() in every process: a run that succeeded ends quietly.

    Process 0 hosts the coordination service. Left to interpreter exit, it may
    go while another process's client still watches it, and gRPC logs
    "WatchTasksAsync failed ... Connection refused" on that process. After the
    barrier every process has finished its work; shutdown() is collective (each
    waits for all at a shutdown barrier), and process 0 stops the service only
    after its own client has passed that barrier, so the coordinator goes last.
    """
    import jax
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("examples/multi_process.py: done")
    jax.distributed.shutdown()


def initialize() -> None:
    """jax.distributed.initialize from torchrun's variables, or JAX's own cluster detection."""
    import jax

    if "RANK" not in os.environ:
        jax.distributed.initialize()  # SLURM, Open MPI, ...: JAX reads the scheduler's variables
        return
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    local = os.environ.get("LOCAL_RANK")
    jax.distributed.initialize(
        address, int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
        # One GPU per process: the one CUDA_VISIBLE_DEVICES leaves, else the host's GPU LOCAL_RANK.
        local_device_ids=[int(local)] if local is not None and "CUDA_VISIBLE_DEVICES" not in os.environ else None,
        coordinator_bind_address=address if os.environ["MASTER_ADDR"] == "127.0.0.1" else None)


# ---------------------------------------------------------------------------
# The launcher (what torchrun or srun would do)
# ---------------------------------------------------------------------------


def launch(processes: int | None) -> int:
    import jaxgraph

    gpus = jaxgraph.device_count()
    if gpus == 0:
        print("CUDA GPUs are needed to run one process per GPU: none found, so this example stops here")
        return 0
    world = processes or max(gpus, 2)
    share = gpus < world
    if share:
        print(f"{world} processes share the one GPU here: this checks the logic, it says nothing of speed")
    with socket.socket() as s:  # a free port on 127.0.0.1 for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seed = str(np.random.default_rng().integers(1 << 30))
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   RANK=str(rank), LOCAL_RANK=str(rank), CUDA_VISIBLE_DEVICES="0" if share else str(rank),
                   XLA_PYTHON_CLIENT_PREALLOCATE="false", EXAMPLE_SEED=seed, PYTHONUNBUFFERED="1")
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        if share:  # a slice of the GPU's memory each; NCCL refuses two ranks on one GPU of one host,
            # so each process is its own "host" to NCCL, and they talk over loopback sockets
            env.update(XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.6 / world:.3f}", NCCL_HOSTID=f"example-{rank}",
                       NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    except subprocess.TimeoutExpired:
        codes = [p.poll() for p in procs]
        print("the processes did not finish within 300 s; stopping them")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(c != 0 for c in codes):
        print(f"exit codes: {codes}")
        return 1
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=None, help="how many (default: one per GPU, at least 2)")
    p.add_argument("--worker", action="store_true", help="be one process of many (a launcher started it)")
    args = p.parse_args()
    if args.worker:
        return worker()
    if args.processes is not None and args.processes < 1:
        p.error(f"--processes must be >= 1, got {args.processes}")
    return launch(args.processes)


if __name__ == "__main__":
    sys.exit(main())
