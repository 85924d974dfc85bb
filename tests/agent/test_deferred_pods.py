"""podsource.DeferredPods: the agent registers its device plugin before its API client exists; a call that needs the
API waits for it (kubelet waits for an Allocate without a deadline) instead of failing the pod's admission."""

from __future__ import annotations

import threading
import time

from gpufleet.agent.podsource import DeferredPods


class Source:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pending_assignment(self, resource, count, exclude):
        self.calls.append(("pending", resource, count, frozenset(exclude)))
        return "assignment"

    def gpu_use(self, resource, count):
        return "use"

    def report_refused(self, pod_key, uid, message, reason="GpuAssignmentRefused"):
        self.calls.append(("refused", pod_key, reason))

    def live_pods(self):
        return {"ns/p"}


def test_a_call_before_the_api_client_waits_for_it_and_is_answered_by_it():
    d, src = DeferredPods(wait_s=10), Source()
    got: list = []
    t = threading.Thread(target=lambda: got.append(d.pending_assignment("nvidia.com/gpu", 1, {"x"})))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    assert not got  # waiting, not answered without the API
    assert d.live_pods() is None  # nothing pruned before the API is there
    d.provide(src)
    t.join(5)
    assert got == ["assignment"] and 0.3 <= time.monotonic() - t0 < 5
    assert src.calls == [("pending", "nvidia.com/gpu", 1, frozenset({"x"}))]
    assert d.gpu_use("nvidia.com/gpu", 2) == "use" and d.live_pods() == {"ns/p"}
    d.report_refused("ns/p", "u", "m", reason="GpuInUse")
    assert src.calls[-1] == ("refused", "ns/p", "GpuInUse")


def test_no_api_at_all_or_none_in_time_leaves_kubelets_choice():
    d = DeferredPods(wait_s=0.2)
    t0 = time.monotonic()
    assert d.pending_assignment("nvidia.com/gpu", 1, set()) is None and time.monotonic() - t0 >= 0.2
    d.provide(None)  # the client could not be built: as without --node-name
    assert d.pending_assignment("nvidia.com/gpu", 1, set()) is None and d.gpu_use("nvidia.com/gpu", 1) is None
    d.report_refused("ns/p", "u", "m")  # nothing to tell, no error
