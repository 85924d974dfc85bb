"""XID classification and the health tracker's recovery rule."""

from __future__ import annotations

import pytest

from gpufleet.agent.health import APPLICATION_XIDS, HARDWARE_XIDS, HealthTracker, is_fatal
from gpufleet.agent.nvml import FakeBackend


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_do_not_mark_unhealthy(xid):
    assert not is_fatal(xid)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119, 1])
def test_hardware_and_unknown_xids_mark_unhealthy(xid):
    assert is_fatal(xid)


def test_tables_are_disjoint():
    assert not APPLICATION_XIDS & HARDWARE_XIDS


def test_recovery_needs_the_quiet_window_and_a_responsive_device():
    be = FakeBackend("t4")
    now = [0.0]
    t = HealthTracker(be, recover_after_s=100, clock=lambda: now[0])
    assert t.update() == {0: True, 1: True, 2: True, 3: True}
    be.inject_xid(0, 94, 0.0)
    be.inject_xid(-1, 79, 0.0)  # no device: ignored
    be.inject_xid(1, 43, 0.0)
    assert t.update() == {0: False, 1: True, 2: True, 3: True} and t.reasons[0] == "XID 94"
    assert t.last_xid == {0: 94, 1: 43}
    now[0] = 60.0
    be.inject_xid(0, 94, 60.0)  # a new fatal XID restarts the window
    assert t.update()[0] is False
    now[0] = 150.0
    assert t.update()[0] is False
    now[0] = 160.0
    assert t.update()[0] is True and 0 not in t.reasons
    be.inject_xid(2, 79, 160.0, device_broken=True)
    now[0] = 1000.0
    assert t.update()[2] is False and t.reasons[2] == "NVML cannot query the device"  # no recovery while NVML cannot reach it
    be.clear_fault(2)
    assert t.update()[2] is False  # reachable again: the window starts now
    now[0] = 1100.0
    assert t.update()[2] is True
