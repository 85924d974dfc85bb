"""The loop's scheduling queue on its own: pending pods, backoff, first-seen times, repeated failure words."""

from __future__ import annotations

from gpufleet.engine.schedqueue import EVERYTHING, Change
from gpufleet.kube.scheduling_queue import SchedulingQueue


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_backoff_doubles_to_its_maximum_and_wake_all_ends_it():
    clock = Clock()
    q = SchedulingQueue(clock, backoff_initial_s=1.0, backoff_max_s=4.0)
    q.add("ml/a", {"x": 1})
    assert q.has_due() and [k for k, _ in q.ready(0.0)] == ["ml/a"]
    waits = []
    for _ in range(4):
        q.defer("ml/a")
        waits.append(q.wakeups()[0] - clock.t)
    assert waits == [1.0, 2.0, 4.0, 4.0] and not q.has_due()
    clock.t = 3.9
    assert not q.ready(clock.t)
    q.wake_all()
    assert q.has_due() and q.wakeups() == [0.0]


def test_defer_until_retries_no_later_than_asked_and_never_in_the_past():
    clock = Clock()
    clock.t = 10.0
    q = SchedulingQueue(clock, backoff_initial_s=8.0, backoff_max_s=60.0)
    q.add("ml/a", {})
    q.defer("ml/a", until=12.0)
    assert q.wakeups() == [12.0]
    q.defer("ml/a", until=5.0)  # a hold that already timed out: now, not before
    assert q.wakeups() == [10.0]


def test_first_seen_is_kept_across_updates_and_returned_when_scheduled():
    clock = Clock()
    q = SchedulingQueue(clock)
    clock.t = 1.0
    q.add("ml/a", {"v": 1})
    clock.t = 5.0
    q.add("ml/a", {"v": 2})  # a newer version of the pod
    assert q.pending["ml/a"] == {"v": 2} and q.first_seen("ml/a") == 1.0
    q.remove("ml/a")
    q.put_back("ml/a", {"v": 2})  # a failed bind: its first-seen time stays
    assert q.first_seen("ml/a") == 1.0
    q.defer("ml/a")
    assert q.remove("ml/a") == {"v": 2} and q.scheduled("ml/a", 99.0) == 1.0
    assert q.first_seen("ml/a", -1.0) == -1.0 and q.scheduled("ml/a", 99.0) == 99.0


def test_clear_keeps_timers_and_forget_drops_them():
    clock = Clock()
    q = SchedulingQueue(clock)
    q.add("ml/a", {})
    q.add("ml/b", {})
    q.defer("ml/a")
    assert q.clear() == {"ml/a", "ml/b"} and not q.pending
    q.add("ml/a", {})
    assert not q.has_due()  # still backing off after a relist
    q.forget("ml/a")
    assert q.has_due() and q.first_seen("ml/a", -1.0) == -1.0


def test_the_same_failure_words_are_not_repeated_within_the_maximum_backoff():
    clock = Clock()
    q = SchedulingQueue(clock, backoff_max_s=60.0)
    assert q.should_report("ml/a", "no room")
    clock.t = 30.0
    assert not q.should_report("ml/a", "no room")
    assert q.should_report("ml/a", "other words") and q.should_report("ml/b", "no room")
    clock.t = 95.0
    assert q.should_report("ml/a", "other words")
    q.forget("ml/a")
    assert q.should_report("ml/a", "other words")


def test_first_come_is_by_creation_time_also_for_pods_first_seen_together():
    # after a restart every pending pod is seen at once: the older pod still comes first, whatever the names
    clock = Clock()
    clock.t = 100.0
    q = SchedulingQueue(clock, wall=lambda: 1_000_000.0)

    def pod(name: str, created_ago_s: float | None) -> dict:
        meta: dict = {"name": name}
        if created_ago_s is not None:
            import datetime

            ts = datetime.datetime.fromtimestamp(1_000_000.0 - created_ago_s, tz=datetime.timezone.utc)
            meta["creationTimestamp"] = ts.strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"metadata": meta}

    q.add("ns/whole-9", pod("whole-9", 47))
    q.add("ns/whole-12", pod("whole-12", 44))
    q.add("ns/no-timestamp", pod("no-timestamp", None))
    assert q.arrival("ns/whole-9") == 53.0 and q.arrival("ns/whole-12") == 56.0
    assert q.arrival("ns/no-timestamp") == 100.0  # first sight
    assert q.first_seen("ns/whole-9") == q.first_seen("ns/whole-12") == 100.0  # latency still counts from first sight
    q.add("ns/whole-9", pod("whole-9", 1))  # a newer version of the pod keeps its place
    assert q.arrival("ns/whole-9") == 53.0
    q.forget("ns/whole-9")
    assert q.arrival("ns/whole-9", -1.0) == -1.0


def test_take_new_hands_each_arrival_over_once():
    q = SchedulingQueue(Clock())
    q.add("ns/a", {"x": 1})
    q.add("ns/b", {"x": 1})
    q.add("ns/a", {"x": 2})  # a newer version is not a new pod
    assert q.take_new() == ["ns/a", "ns/b"] and q.take_new() == []
    q.forget("ns/a")
    q.add("ns/a", {"x": 3})  # gone and back (recreated): new again
    assert q.take_new() == ["ns/a"]


def test_parked_pods_wake_by_what_changed_and_the_others_on_any_change():
    """A pod the engine gave reasons for is parked in ``engine.pending.PendingGroups`` (the replay's waiting pods):
    a pod leaving a node wakes it only if it could fit there; a pod that failed for no known reason wakes on any
    change; a parked pod no change woke is tried when its backoff runs out; a bound or forgotten pod leaves it."""
    from gpufleet.engine.model import Assignment, PodRequest

    from tests.builders import T4, make_node, state_of

    st = state_of(make_node("n0", 1, T4, cpu_milli=16_000), make_node("n1", 2, T4, cpu_milli=16_000))
    st.reserve(Assignment("ml/u", "n1", 0, 0, gpu_indices=(0, 1), gpu_milli=1000, gpu_memory_mib=(0, 0)))
    clock = Clock()
    q = SchedulingQueue(clock, backoff_initial_s=10.0, hints={"NodeResourcesFit": "room"})
    big = PodRequest("big", "ml", cpu_milli=1000, memory_mib=1024, gpu_count=2, gpu_milli=1000)
    for k in ("ml/big", "ml/blind"):
        q.add(k, {})
    q.defer("ml/big", rejected=(big, ["NodeResourcesFit"]))
    q.defer("ml/blind")
    assert "ml/big" in q.parked.by_key and not q.ready(1.0)
    q.changed(Change((0,)), st)  # n0 has one GPU: big cannot fit there, the blind pod may
    assert [k for k, _ in q.ready(1.0)] == ["ml/blind"]
    q.remove("ml/blind")
    q.changed(Change((1,)), st)  # nothing left n1 yet: no room there either
    assert not q.ready(1.0)
    st.unreserve("ml/u")
    q.changed(Change((1,)), st)
    assert [k for k, _ in q.ready(1.0)] == ["ml/big"]
    q.defer("ml/big", rejected=(big, ["NodeResourcesFit"]))  # again: 20 s, then tried anyway (the periodic flush)
    assert not q.ready(19.0) and [k for k, _ in q.ready(20.0)] == ["ml/big"]
    q.scheduled("ml/big", 0.0)
    assert "ml/big" not in q.parked.by_key and len(q.parked) == 0
    q.changed(EVERYTHING, st)  # a node or policy object changed: every waiting pod
