"""Start N processes of one JAX program on this machine, as a cluster launcher would.

What a launcher gives each process is what ``torchrun`` gives it:
``MASTER_ADDR``/``MASTER_PORT`` (the coordinator, here 127.0.0.1 on a free
port), ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; :func:`initialize` reads
them in the worker and calls ``jax.distributed.initialize``. Each process sees
one GPU through ``CUDA_VISIBLE_DEVICES`` (its own, or with ``share_gpu`` the
same one for every process, each with a fraction of its memory: the way to
run the multi-process path on a one-GPU machine; NCCL then gets a host id per
process, since it refuses two ranks on one GPU of one host, and talks over
loopback sockets).

:func:`launch` waits for every process with one timeout; on timeout it kills
them all and returns each one's output, so a hang is a report, not a stuck run.
Used by tests/jax_interop/test_multiprocess.py and benchmarks/scaling_processes.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple, Sequence

__all__ = ["ProcessResult", "free_port", "initialize", "launch", "process_env", "report"]


class ProcessResult(NamedTuple):
    """One process of a :func:`launch`: its rank, exit status (``None`` if killed), output, and timing."""

    rank: int
    returncode: int | None
    output: str
    timed_out: bool
    wall_s: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(rank: int, world: int, port: int, *, platform: str = "gpu", share_gpu: bool = False,
                base: dict | None = None) -> dict:
    """The environment of process ``rank`` of ``world`` (torchrun's variables, its GPU, NCCL's settings).

    ``platform="cpu"`` runs JAX on the CPU (cross-process collectives over
    gloo). With ``share_gpu`` every process uses GPU 0 with ``0.6 / world`` of
    its memory and its own NCCL host id.
    """
    env = dict(os.environ if base is None else base)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
               LOCAL_RANK=str(rank), PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared machines
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        return env
    env["CUDA_VISIBLE_DEVICES"] = "0" if share_gpu else str(rank)
    if share_gpu:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.6 / world:.3f}"
        # NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"); a host id per
        # process makes each rank its own host, and their traffic goes over loopback sockets.
        env.update(NCCL_HOSTID=f"jaxgraph-shared-gpu-{rank}", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    return env


def launch(argv: Sequence[str], world: int, *, timeout_s: float, platform: str = "gpu", share_gpu: bool = False,
           cwd: str | None = None, extra_env: dict | None = None) -> list[ProcessResult]:
    """Run ``python argv...`` as ``world`` processes (ranks 0..world-1) and wait for all of them.

    Every process's output (stdout and stderr together) comes back. When
    ``timeout_s`` passes, every process still running is killed (its whole
    process group) and marked ``timed_out``.
    """
    port = free_port()
    procs, files = [], []
    start = time.monotonic()
    try:
        for rank in range(world):
            env = process_env(rank, world, port, platform=platform, share_gpu=share_gpu)
            env.update(extra_env or {})
            # A file, not a pipe: a pipe nobody reads while waiting could fill and block the process.
            out = tempfile.NamedTemporaryFile("w+", prefix=f"jaxgraph-rank{rank}-", suffix=".log", delete=False)
            files.append(out)
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        ended = [None] * world
        while time.monotonic() - start < timeout_s and any(e is None for e in ended):
            for i, p in enumerate(procs):
                if ended[i] is None and p.poll() is not None:
                    ended[i] = time.monotonic() - start
            time.sleep(0.05)
        results = []
        for i, p in enumerate(procs):
            timed_out = p.poll() is None
            if timed_out:
                _kill(p)
            files[i].seek(0)
            results.append(ProcessResult(i, None if timed_out else p.returncode, files[i].read(), timed_out,
                                         ended[i] if ended[i] is not None else time.monotonic() - start))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        for f in files:
            f.close()
            try:
                os.unlink(f.name)
            except OSError:
                pass


def report(results: Sequence[ProcessResult], tail: int = 6000) -> str:
    """Each process's status and the end of its output, for an assertion message or a log."""
    parts = []
    for r in results:
        status = "killed at the timeout" if r.timed_out else f"exit {r.returncode}"
        parts.append(f"----- process {r.rank}: {status} after {r.wall_s:.1f} s -----\n{r.output[-tail:]}")
    return "\n".join(parts)


def initialize(timeout_s: int = 120) -> tuple[int, int]:
    """In a worker: ``jax.distributed.initialize`` from torchrun's variables, or JAX's own cluster detection.

    With ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (this
    module's :func:`launch`, torchrun and alike) they name the coordinator and
    this process; otherwise JAX detects SLURM, Open MPI and others itself.
    When ``CUDA_VISIBLE_DEVICES`` is unset, ``LOCAL_RANK`` picks the GPU.
    Returns ``(process_index, process_count)``.
    """
    import jax

    if os.environ.get("JAX_PLATFORMS") == "cpu":  # cross-process collectives of JAX's CPU backend
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except AttributeError:  # a jax without the option chooses for itself
            pass
    if "RANK" in os.environ and "MASTER_PORT" in os.environ:
        address = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
        local = os.environ.get("LOCAL_RANK")
        ids = [int(local)] if local is not None and "CUDA_VISIBLE_DEVICES" not in os.environ else None
        loopback = address.startswith(("127.0.0.1:", "localhost:"))
        jax.distributed.initialize(address, int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
                                   local_device_ids=ids, initialization_timeout=timeout_s,
                                   coordinator_bind_address=address if loopback else None)
    else:
        jax.distributed.initialize(initialization_timeout=timeout_s)
    return jax.process_index(), jax.process_count()


def _kill(p: subprocess.Popen) -> None:
    """Kill ``p`` and everything it started (its own session), then reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
