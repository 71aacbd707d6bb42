"""Cross-process agreement (``processes.agree``) on a fake key-value store, threads standing in for processes.

Every round must end with every process returning the same records, or every
process raising the same error: with staggered starts, a process that arrives
after the others gave up, a retry, and a process that dies mid-agreement. The
fake store answers as JAX's distributed client does (``ALREADY_EXISTS``,
``NOT_FOUND``, ``DEADLINE_EXCEEDED`` in the message; checked against the real
client in tests/jax_interop/test_multiprocess.py, which runs two processes over gloo).
Interleavings that matter are forced with gates in the store, not with sleeps.

Tests internals (listed in tests/README.md): ``_jax_interop.processes.agree_through``, ``Rounds``.
"""

import json
import threading
import time

import numpy as np
import pytest

from jaxgraph._jax_interop import processes as _processes


class Died(BaseException):
    """A process that stops in the middle of an agreement (its thread ends; it writes nothing more)."""


class FakeStore:
    """JAX's ``DistributedRuntimeClient`` key-value calls, in memory; ``hooks`` run before each call."""

    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()
        self.local = threading.local()  # which process the calling thread stands for
        self.hooks = []  # (process, callable(op, key, timed_out)) run before each operation

    def _before(self, op, key):
        me = getattr(self.local, "process", None)
        for process, hook in self.hooks:
            if process == me:
                hook(op, key, getattr(self.local, "timed_out", False))

    def key_value_set(self, key, value, allow_overwrite=False):
        self._before("set", key)
        with self.cond:
            if key in self.data and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: key {key} already exists.")
            self.data[key] = value
            self.cond.notify_all()

    def blocking_key_value_get(self, key, timeout_in_ms):
        self._before("get", key)
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, timeout_in_ms / 1000):
                self.local.timed_out = True
                raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
            return self.data[key]

    def key_value_try_get(self, key):
        self._before("try_get", key)
        with self.cond:
            if key not in self.data:
                raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
            return self.data[key]

    def key_value_delete(self, key):
        self._before("delete", key)
        with self.cond:
            self.data.pop(key, None)


class Processes:
    """``count`` stand-in processes on one store, each with its own rounds (what a real process keeps)."""

    def __init__(self, count):
        self.store, self.count = FakeStore(), count
        self.rounds = [_processes.Rounds() for _ in range(count)]

    def agree(self, me, record, timeout_s, subject="mesh"):
        """One call of ``agree`` as process ``me``: ("ok", records), ("error", message) or ("died", None)."""
        self.store.local.process, self.store.local.timed_out = me, False
        try:
            return "ok", _processes.agree_through(self.store, me, self.count, self.rounds[me], "check", record,
                                                  subject=subject, timeout_s=timeout_s)
        except RuntimeError as exc:
            return "error", str(exc)
        except Died:
            return "died", None

    def run(self, plans):
        """Run ``plans[p]()`` on a thread per process; their results, in process order."""
        results = [None] * len(plans)

        def body(p):
            results[p] = plans[p]()

        threads = [threading.Thread(target=body, args=(p,), daemon=True) for p in range(len(plans))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "an agreement never returned"
        return results


def one_outcome(results):
    """Every live process returned the same records, or raised the same message; that outcome."""
    live = [r for r in results if r[0] != "died"]
    assert live and len({json.dumps(r) for r in live}) == 1, results
    return live[0]


def missing(message):
    """The processes a timed-out round's message names."""
    import re

    found = re.match(r"check: process(?:es)? ([\d, ]+) did not reach", message)
    assert found, message
    return [int(p) for p in found.group(1).split(", ")]


def records(count, tag):
    return [{"process": p, "tag": tag} for p in range(count)]


def test_processes_that_all_arrive_return_every_record_in_process_order():
    procs = Processes(3)
    out = procs.run([lambda p=p: procs.agree(p, {"process": p, "tag": "a"}, 10) for p in range(3)])
    assert one_outcome(out) == ("ok", records(3, "a"))
    out = procs.run([lambda p=p: procs.agree(p, {"process": p, "tag": "b"}, 10) for p in range(3)])
    assert one_outcome(out) == ("ok", records(3, "b"))  # the next round reads its own records only


def test_a_record_read_at_the_deadline_cannot_split_the_processes():
    # Process 0 times out; process 1 arrives just then and reads process 0's record before process 0
    # writes anything more (the old code deleted it there, after process 1 had read it, and raised:
    # process 1 went on to run the step and waited forever in its psum).
    procs = Processes(2)
    at_gate, p1_done = threading.Event(), threading.Event()

    def hold_after_timeout(op, key, timed_out):
        if timed_out and op in ("set", "delete"):
            at_gate.set()
            p1_done.wait(10)

    procs.store.hooks.append((0, hold_after_timeout))

    def late():
        at_gate.wait(10)
        try:
            return procs.agree(1, {"process": 1, "tag": "a"}, 10)
        finally:
            p1_done.set()

    out = procs.run([lambda: procs.agree(0, {"process": 0, "tag": "a"}, 0.3), late])
    assert at_gate.is_set()
    assert one_outcome(out) == ("ok", records(2, "a"))  # process 1 decided first: process 0 follows it


def test_a_process_that_arrives_after_the_others_gave_up_raises_their_error_and_a_retry_is_a_fresh_round():
    procs = Processes(3)
    gave_up = threading.Event()

    def early(p):
        result = procs.agree(p, {"process": p, "tag": "a"}, 1.0 + p)  # long enough for the other early one
        gave_up.set()
        return result

    def late():
        gave_up.wait(10)
        start = time.monotonic()
        result = procs.agree(2, {"process": 2, "tag": "a"}, 10)
        assert time.monotonic() - start < 5  # it reads the decision; it does not wait out its own timeout
        return result

    out = procs.run([lambda: early(0), lambda: early(1), late])
    kind, message = one_outcome(out)
    assert kind == "error"
    assert message.startswith("check: process 2 did not reach this check within 1 s (round 0 on this subject, "
                              "given up by process 0 of 3; every process raises this error)"), message
    # The retry: the next call on every process is round 1, which never sees round 0's records.
    out = procs.run([lambda p=p: procs.agree(p, {"process": p, "tag": "retry"}, 10) for p in range(3)])
    assert one_outcome(out) == ("ok", records(3, "retry"))


def test_every_missing_process_is_named():
    procs = Processes(4)
    out = procs.run([lambda: procs.agree(0, {}, 1), lambda: procs.agree(2, {}, 5)] + [lambda: ("died", None)] * 2)
    kind, message = one_outcome(out)
    assert kind == "error" and message.startswith("check: processes 1, 3 did not reach this check within 1 s")


@pytest.mark.parametrize("when", ["before_publishing", "after_publishing", "after_deciding"])
def test_a_process_that_dies_mid_agreement_leaves_one_outcome_to_the_others(when):
    procs = Processes(3)

    late = threading.Event()  # after_deciding: process 2 arrives once process 1 has decided and died
    decided = []

    def die(op, key, timed_out):
        if when == "before_publishing" and op == "set":
            raise Died
        if when == "after_publishing" and op == "get":
            raise Died
        if when == "after_deciding" and op == "set" and key.endswith("decision"):
            decided.append(key)
        elif when == "after_deciding" and op == "try_get" and decided:
            late.set()
            raise Died  # it wrote "timed out" and stops before reading the decision back

    procs.store.hooks.append((1, die))
    timeouts = {"before_publishing": (0.3, 0.3, 5), "after_publishing": (5, 5, 5),
                "after_deciding": (5, 0.2, 5)}[when]

    def third():
        if when == "after_deciding":
            late.wait(10)
        start = time.monotonic()
        result = procs.agree(2, {"process": 2, "tag": "a"}, timeouts[2])
        return result, time.monotonic() - start

    out = procs.run([lambda: procs.agree(0, {"process": 0, "tag": "a"}, timeouts[0]),
                     lambda: procs.agree(1, {"process": 1, "tag": "a"}, timeouts[1]), third])
    (third_result, third_s), out[2] = out[2], out[2][0]
    assert out[1] == ("died", None)
    kind, value = one_outcome(out)
    if when == "after_publishing":
        assert (kind, value) == ("ok", records(3, "a"))  # its record was there: the round is agreed
    else:
        assert kind == "error"
        if when == "before_publishing":
            assert 1 in missing(value), value
        else:
            # process 1 gave up first (on its own short timeout) and died: its decision names process 2
            # (process 0 too, had it been slow to publish), and stands: nobody waits out a timeout.
            assert 1 not in missing(value) and 2 in missing(value), value
            assert third_s < 4, third_s


def test_staggered_starts_and_deadlines_always_end_in_one_outcome_per_round():
    # Random start delays around the timeouts, two rounds each (a failed round is retried): whatever the
    # interleaving, each round ends the same on every process.
    rng = np.random.default_rng()
    for trial in range(8):
        count = int(rng.integers(2, 5))
        procs = Processes(count)
        delays = rng.uniform(0, 0.3, size=(count, 2))
        timeouts = rng.uniform(0.05, 0.3, size=(count, 2))

        def plan(p):
            out = []
            for r in range(2):
                time.sleep(delays[p, r])
                out.append(procs.agree(p, {"process": p, "tag": r}, float(timeouts[p, r])))
            return out

        out = procs.run([lambda p=p: plan(p) for p in range(count)])
        for r in range(2):
            kind, value = one_outcome([o[r] for o in out])
            if kind == "ok":
                assert value == records(count, r), (trial, r, value)
            else:
                assert value.startswith("check: process"), value


def test_a_record_already_in_the_store_for_this_process_and_round_is_an_error():
    procs = Processes(1)
    procs.store.data[f"jaxgraph/check/{_digest('mesh')}/0/0"] = "{}"
    assert procs.agree(0, {}, 1) == ("error", "check: process 0's record for round 0 is already in the key-value "
                                              "store: two processes share the index 0, or another program uses the "
                                              "same coordinator")


def test_store_errors_other_than_the_expected_ones_are_raised_with_the_key():
    class Broken(FakeStore):
        def blocking_key_value_get(self, key, timeout_in_ms):
            raise RuntimeError("UNAVAILABLE: the coordinator is gone")

    procs = Processes(2)
    procs.store = Broken()
    kind, message = procs.agree(0, {}, 1)
    assert kind == "error" and message.startswith("check: reading jaxgraph/check/") and "UNAVAILABLE" in message


def _digest(subject):
    import hashlib

    return hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()[:16]
