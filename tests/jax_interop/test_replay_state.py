"""A replayable's liveness record, on the CPU: devices added and dropped under its lock.

Tests internals (listed in tests/README.md): ``_jax_interop.replay_boundary.ReplayState``, whose
``retire`` a graph's destroy callback runs on any thread, so adding a device must take
the same lock, and a device whose registration was refused must be addable again.
"""

import sys
import threading

from jaxgraph._jax_interop.replay_boundary import ReplayState


def test_added_devices_are_live_and_retired_ones_are_not():
    state = ReplayState(graph_id=0)  # id 0: nothing native to retire
    state.add(1)
    state.add(0)
    assert state.alive and state.live_devices == [0, 1]
    state.retire(1)
    assert state.live_devices == [0] and state.devices == {0: True, 1: False}
    state.retire()
    assert state.closed and not state.alive and state.live_devices == []


def test_a_dropped_device_is_forgotten_so_it_can_be_added_again():
    state = ReplayState(graph_id=0)
    state.add(0)
    state.drop(0)
    assert 0 not in state.devices
    state.add(0)
    assert state.live_devices == [0]


def test_retiring_while_devices_are_added_never_raises():
    # Bounded on both sides: an unbounded retiring loop starved the adding thread of the lock
    # on a 16-core machine (the test ran past 5 minutes there).
    state = ReplayState(graph_id=0)
    errors = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, mid-iteration

    def retire_often():
        try:
            for _ in range(4000):
                state.retire_callback(0)()
        except Exception as e:  # noqa: BLE001 - a destroy callback must never raise
            errors.append(e)

    thread = threading.Thread(target=retire_often, daemon=True)
    try:
        thread.start()
        for d in range(4000):
            state.add(d)
        thread.join(timeout=60)
    finally:
        sys.setswitchinterval(switch)
    assert not thread.is_alive(), "retiring 4000 times did not finish in 60 s"
    assert errors == [] and len(state.devices) == 4000
