"""Several processes (``jax.distributed``): every process agrees before a step runs anywhere.

In a multi-controller JAX program (one process per GPU or per host, after
``jax.distributed.initialize``) each process captures graphs for its own
devices (``jax.local_devices()``) and compiles its own copy of one program.
Two things must then hold on every process, and neither can be seen from one
process alone:

- every process has a live graph for each of its devices in the mesh, with
  the same shapes: a process whose replay fails leaves the others waiting in
  the step's collectives (a ``psum`` over NCCL), a hang instead of an error;
- the lowered programs are the same: HLO names a graph by its id in the
  process's native table, and a multi-controller program must be the same on
  every process (with ``jax_share_binary_between_hosts`` process 0 compiles
  and the others wait for the executable under a key made from their own
  program). Ids count up in the order a process made its replayables, so a
  process that made one more first has shifted ids.

:func:`agree` exchanges one small record per process through the key-value
store of JAX's distributed runtime (no device, no collective: it works with
JAX on the CPU and answers within a timeout when a process never arrives),
and :func:`disagreements` turns the records into one message that every
process raises alike; :func:`check_everywhere` runs a local check under
both. :meth:`jaxgraph.ShardedGraph.check_devices` uses it when its mesh
spans several processes.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any, Callable, Sequence

__all__ = ["agree", "check_everywhere", "device_list", "disagreements", "is_mesh", "local_devices",
           "process_count", "process_index"]

_agreed: dict[tuple[str, str], int] = {}  # (topic, subject digest) -> agreements reached on it by this process
_agreed_lock = threading.Lock()


def agree(topic: str, record: dict, *, subject: Any, timeout_s: float) -> list[dict]:
    """Publish ``record`` and return every process's record, in process order.

    Collective: every process must call it with the same ``topic`` and
    ``subject``. The key-value store keys come from what is agreed on, not
    from the order of calls: ``subject`` (JSON-serialisable: the mesh's
    devices, say) and how many agreements on that subject this process has
    reached. A process that made other checks first, or whose earlier check
    on the subject timed out (its record is taken back; the count moves only
    on an agreement), meets the others on the same keys. Records are
    JSON-serialisable dicts; what may differ between processes belongs in
    the record (compared by :func:`disagreements`), not in ``subject``.

    Raises
    ------
    RuntimeError
        JAX's distributed runtime is not initialized, or a process did not
        publish its record within ``timeout_s`` (it failed earlier, or runs
        other code): the message names it.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    client = _client()
    me, count = process_index(), process_count()
    digest = hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()[:16]
    with _agreed_lock:
        round_ = _agreed.get((topic, digest), 0)
    prefix = f"jaxgraph/{topic}/{digest}/{round_}/"
    # The records stay in the coordinator: a process may still be reading them
    # when this one moves on, and each is a few hundred bytes.
    _publish(client, prefix + str(me), json.dumps(record))
    try:
        records = _read_all(client, prefix, record, me, count, topic, timeout_s)
    except BaseException:
        _take_back(client, prefix + str(me))  # a later try on this subject must not meet this record
        raise
    with _agreed_lock:
        _agreed[(topic, digest)] = round_ + 1
    return records


def _read_all(client: Any, prefix: str, record: dict, me: int, count: int, topic: str,
              timeout_s: float) -> list[dict]:
    """Every process's record under ``prefix``, waiting at most ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    records = []
    for p in range(count):
        if p == me:
            records.append(record)
            continue
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            records.append(json.loads(client.blocking_key_value_get(prefix + str(p), left_ms)))
        except Exception as exc:  # jax.errors.JaxRuntimeError; its message says DEADLINE_EXCEEDED
            if "DEADLINE_EXCEEDED" not in str(exc):
                raise RuntimeError(f"{topic}: reading process {p}'s record failed: {exc}") from exc
            raise RuntimeError(
                f"{topic}: process {p} did not reach this check within {timeout_s:g} s (this is process {me} "
                f"of {count}); every process must run it, in the same order: process {p} may have failed "
                "before it or be running other code") from None
    return records


def _publish(client: Any, key: str, value: str) -> None:
    """Set ``key``, replacing what an earlier, abandoned try left there."""
    try:
        client.key_value_set(key, value, allow_overwrite=True)
    except TypeError:  # a jax whose client has no allow_overwrite
        _take_back(client, key)
        client.key_value_set(key, value)


def _take_back(client: Any, key: str) -> None:
    """Delete ``key`` from the store (never raises)."""
    try:
        client.key_value_delete(key)
    except Exception:
        pass


def disagreements(records: Sequence[dict], fields: dict[str, str]) -> list[str]:
    """One line per problem in ``records`` (one dict per process, in process order).

    A record's ``"error"`` (a string, or ``None``) is that process's own
    problem; each key of ``fields`` must be equal on every process without
    an error, and its value says what the key is (``{"graph": "graph ids"}``).
    """
    lines = [f"process {p}: {r['error']}" for p, r in enumerate(records) if r.get("error")]
    healthy = [(p, r) for p, r in enumerate(records) if not r.get("error")]
    for key, what in fields.items():
        if len({json.dumps(r.get(key)) for _, r in healthy}) > 1:
            values = "; ".join(f"process {p}: {_show(r.get(key))}" for p, r in healthy)
            lines.append(f"{what} differ between processes ({values})")
    return lines


def check_everywhere(topic: str, what: str, check: Callable[[], Any], facts: dict, fields: dict[str, str], *,
                     subject: Any, timeout_s: float, advice: str) -> Any:
    """Run ``check`` on this process and make any process's failure every process's (collective).

    A ``ValueError`` or ``RuntimeError`` from ``check`` is not raised here
    at once: it is shared through :func:`agree` (on ``subject``) with ``facts`` (a dict,
    compared between processes by :func:`disagreements` with ``fields``).
    Returns what ``check`` returned when no process failed and the facts
    agree; otherwise every process raises the same ``ValueError``: that the
    processes disagree about ``what``, each problem, then ``advice``.
    """
    try:
        result, error = check(), None
    except (ValueError, RuntimeError) as exc:  # every process must learn of it, not only this one
        result, error = None, f"{type(exc).__name__}: {exc}"
    records = agree(topic, {"error": error, **facts}, subject=subject, timeout_s=timeout_s)
    problems = disagreements(records, fields)
    if problems:
        raise ValueError(f"the processes disagree about {what}, so none may run the step: "
                         f"{'; '.join(problems)}. {advice}")
    return result


def local_devices(devices: Any) -> tuple[list, bool]:
    """``devices`` (a Mesh, a device or a sequence) as a list of this process's, and whether others' were there.

    The one rule for device lists that span processes (``devices.device_ordinals``
    uses it too): a mesh, a sequence or a single device stands for its
    devices of this process; the others' are dropped (they are for the
    cross-process check). CUDA ordinals (ints) are this process's. Raises
    ``TypeError`` for anything else than these.
    """
    devices = device_list(devices)
    if not any(hasattr(d, "process_index") for d in devices):
        return devices, False
    here = process_index()
    local = [d for d in devices if getattr(d, "process_index", here) == here]
    return local, len(local) < len(devices)


def device_list(devices: Any) -> list:
    """``devices`` (a Mesh, a device or a sequence of them) as a flat list; ``TypeError`` for anything else."""
    import numpy as np

    if is_mesh(devices):
        return list(np.asarray(devices.devices).flat)
    if isinstance(devices, (int, np.integer)) or hasattr(devices, "platform"):
        return [devices]
    if not isinstance(devices, (list, tuple, range)) and not hasattr(devices, "__iter__"):
        raise TypeError(f"devices must be a Mesh, a device or a sequence of devices, got {type(devices).__name__}")
    return list(devices)


def is_mesh(devices: Any) -> bool:
    """Whether ``devices`` is a ``jax.sharding.Mesh`` (or looks like one)."""
    return hasattr(devices, "devices") and hasattr(devices, "axis_names")


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _client() -> Any:
    """The key-value client of ``jax.distributed`` (JAX has no public API for it)."""
    from jax._src import distributed

    client = getattr(distributed.global_state, "client", None)
    if client is None:
        raise RuntimeError("the devices span several processes but jax.distributed is not initialized here; "
                           "call jax.distributed.initialize(...) first in every process")
    return client


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    return str(value)
