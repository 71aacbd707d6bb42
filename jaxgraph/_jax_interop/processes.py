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
JAX on the CPU and answers within a timeout when a process never arrives;
each round ends in one decision written once, which every process follows),
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

__all__ = ["Rounds", "agree", "agree_through", "check_everywhere", "device_list", "disagreements", "is_mesh",
           "local_devices", "process_count", "process_index"]

_POLL_S = 0.25  # how often a waiting process looks whether another already decided the round


def agree(topic: str, record: dict, *, subject: Any, timeout_s: float) -> list[dict]:
    """Publish ``record`` and return every process's record, in process order.

    Collective: every process must call it with the same ``topic`` and
    ``subject``, the same number of times. The key-value store keys come
    from what is agreed on, not from the order of calls: ``subject``
    (JSON-serialisable: the mesh's devices, say) and how many times this
    process called ``agree`` on it before (its round). A process that made
    other checks first meets the others on the same keys. Records are
    JSON-serialisable dicts; what may differ between processes belongs in
    the record (compared by :func:`disagreements`), not in ``subject``.

    Each round has one outcome, the same on every process that takes part:
    a decision written once to the store (the first process to see every
    record writes "agreed", the first whose ``timeout_s`` runs out first
    writes "timed out"; a write finds the other one there and follows it).
    So either every process returns the same records, or every process
    raises the same error: a process that reaches a round the others gave
    up on raises their error at once, and a retry is the next round on
    every process, which never reads an earlier round's records. A process
    that dies before publishing its record makes the round time out on
    every other one; records are never taken back.

    Raises
    ------
    RuntimeError
        JAX's distributed runtime is not initialized, or a process did not
        publish its record within the first ``timeout_s`` to run out (it
        failed earlier, or runs other code): the message names it and is
        the same on every process. Also when the key-value store itself
        fails (the coordinator is gone): then on this process alone.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return agree_through(_client(), process_index(), process_count(), _ROUNDS, topic, record,
                         subject=subject, timeout_s=timeout_s)


class Rounds:
    """How many agreements this process has started per (topic, subject digest): the next round's number."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def take(self, topic: str, digest: str) -> int:
        """The number of this call's round; every call counts, a timed-out one too."""
        with self._lock:
            round_ = self._next.get((topic, digest), 0)
            self._next[(topic, digest)] = round_ + 1
            return round_


_ROUNDS = Rounds()


def agree_through(client: Any, me: int, count: int, rounds: Rounds, topic: str, record: dict, *,
                  subject: Any, timeout_s: float) -> list[dict]:
    """:func:`agree` on a given key-value ``client`` as process ``me`` of ``count`` (tests pass a fake store)."""
    store = _Store(client, topic)
    digest = hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()[:16]
    round_ = rounds.take(topic, digest)
    prefix = f"jaxgraph/{topic}/{digest}/{round_}/"
    if not store.set_once(prefix + str(me), json.dumps(record)):
        raise RuntimeError(f"{topic}: process {me}'s record for round {round_} is already in the key-value store: "
                           f"two processes share the index {me}, or another program uses the same coordinator")
    decision, records = _settle(store, prefix, me, count, {me: record}, timeout_s)
    if not decision["agreed"]:
        missing = decision["missing"]
        who = f"process {missing[0]}" if len(missing) == 1 else "processes " + ", ".join(map(str, missing))
        raise RuntimeError(
            f"{topic}: {who} did not reach this check within {decision['timeout_s']:g} s (round {round_} on this "
            f"subject, given up by process {decision['by']} of {count}; every process raises this error); every "
            f"process must run it, in the same order: {who} may have failed before it or be running other code")
    for p in range(count):  # an agreed round has every record in the store, never taken back
        if p not in records:
            value = store.try_get(prefix + str(p))
            if value is None:
                raise RuntimeError(f"{topic}: process {p}'s record of round {round_} left the key-value store")
            records[p] = json.loads(value)
    return [records[p] for p in range(count)]


def _settle(store: "_Store", prefix: str, me: int, count: int, records: dict[int, dict],
            timeout_s: float) -> tuple[dict, dict[int, dict]]:
    """The round's decision (written once: the first to see every record, or to time out, decides) and the records read."""
    deadline = time.monotonic() + timeout_s
    look = True  # whether another process may have decided since this one last looked
    while True:
        if look and (found := store.try_get(prefix + "decision")) is not None:
            return json.loads(found), records
        missing = [p for p in range(count) if p not in records]
        left = deadline - time.monotonic()
        if missing and left <= 0:  # name only those still absent, not those this one had not waited for yet
            for p in missing:
                if (value := store.try_get(prefix + str(p))) is not None:
                    records[p] = json.loads(value)
            missing = [p for p in missing if p not in records]
        if not missing or left <= 0:
            mine = ({"agreed": True, "by": me} if not missing else
                    {"agreed": False, "by": me, "missing": missing, "timeout_s": timeout_s})
            store.set_once(prefix + "decision", json.dumps(mine))  # the first decision stands, this one or another
            found = store.try_get(prefix + "decision")
            if found is None:
                raise RuntimeError(f"{store.topic}: the decision of {prefix} left the key-value store")
            return json.loads(found), records
        value = store.get(prefix + str(missing[0]), min(left, _POLL_S))
        look = value is None
        if value is not None:
            records[missing[0]] = json.loads(value)


class _Store:
    """The few key-value operations an agreement needs, with JAX's error codes turned into results."""

    def __init__(self, client: Any, topic: str) -> None:
        self.client, self.topic = client, topic

    def set_once(self, key: str, value: str) -> bool:
        """Write ``key`` if it is absent (never overwrites); whether this call wrote it."""
        try:
            self.client.key_value_set(key, value)  # allow_overwrite is False: the store refuses a second write
        except Exception as exc:  # jax.errors.JaxRuntimeError
            if "ALREADY_EXISTS" in str(exc):
                return False
            raise RuntimeError(f"{self.topic}: writing {key} to the key-value store failed: {exc}") from exc
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        """``key``'s value, waiting at most ``timeout_s``; ``None`` when it is still absent then."""
        try:
            return self.client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
        except Exception as exc:
            if "DEADLINE_EXCEEDED" in str(exc):
                return None
            raise RuntimeError(f"{self.topic}: reading {key} from the key-value store failed: {exc}") from exc

    def try_get(self, key: str) -> str | None:
        """``key``'s value now, or ``None`` when it is absent."""
        try:
            return self.client.key_value_try_get(key)
        except Exception as exc:
            if "NOT_FOUND" in str(exc):
                return None
            raise RuntimeError(f"{self.topic}: reading {key} from the key-value store failed: {exc}") from exc


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
