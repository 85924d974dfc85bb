"""ResourceSlice publishing: one pool per node, chunks of 64, republished after kubelet wipes them or anyone edits them."""

from __future__ import annotations

import threading

from gpufleet.agent.dra.devices import DraOptions, build_devices
from gpufleet.agent.dra.slices import SlicePublisher, build_slices, slice_name
from gpufleet.agent.nvml import PROFILES

from .conftest import wait_for
from .dra_fake import FakeDraApi

DRIVER = "gpu.gpufleet.io"


def devs(profile="a100-mig"):
    drv, gpus = PROFILES[profile]
    return build_devices(gpus, drv, DraOptions()).devices


def test_build_slices_one_pool_per_node_chunks_of_64():
    many = [{"name": f"d-{i}"} for i in range(150)]
    s = build_slices("node-a", DRIVER, many, 7, owner={"kind": "Node", "name": "node-a", "uid": "u"})
    assert [len(x["spec"]["devices"]) for x in s] == [64, 64, 22]
    assert all(x["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 3} for x in s)
    assert all(x["spec"]["nodeName"] == "node-a" and x["spec"]["driver"] == DRIVER for x in s)
    assert [x["metadata"]["name"] for x in s] == [f"node-a-{DRIVER}-{i}" for i in range(3)]
    assert s[0]["metadata"]["ownerReferences"][0]["uid"] == "u"
    empty = build_slices("node-a", DRIVER, [], 1)
    assert len(empty) == 1 and "devices" not in empty[0]["spec"]  # an empty pool is published as such
    assert len(slice_name("n" * 250, DRIVER, 0)) <= 253


def test_publish_once_then_nothing_until_something_changes():
    api = FakeDraApi()
    p = SlicePublisher(api, "node-a", DRIVER)
    p.set_devices(devs())
    assert p.sync()
    (s,) = api.slices.values()
    assert len(s["spec"]["devices"]) == 16 and s["spec"]["pool"]["generation"] == 1
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid-1",
                                                 "controller": True}]
    writes = p.writes
    for _ in range(3):
        p.set_devices(devs())  # the same devices: no write
        p.sync(force=True)
    assert p.writes == writes
    p.set_devices(devs()[:5])
    p.sync()
    (s,) = api.slices.values()
    assert len(s["spec"]["devices"]) == 5 and s["spec"]["pool"]["generation"] == 2


def test_republished_after_kubelet_wipes_the_nodes_slices():
    api = FakeDraApi()
    p = SlicePublisher(api, "node-a", DRIVER)
    p.set_devices(devs())
    p.sync()
    api.wipe_slices("node-a")  # kubelet starting, or 30 s after the plugin disconnected
    p.notice("DELETED", {"metadata": {"name": slice_name("node-a", DRIVER, 0)}})
    assert p.sync()
    (s,) = api.slices.values()
    assert len(s["spec"]["devices"]) == 16 and s["spec"]["pool"]["generation"] == 2
    # a periodic check finds it too, without the watch
    api.wipe_slices("node-a")
    assert p.sync(force=True) and len(api.slices) == 1


def test_someone_elses_edit_and_leftovers_are_repaired():
    api = FakeDraApi()
    p = SlicePublisher(api, "node-a", DRIVER)
    p.set_devices(devs())
    p.sync()
    name = slice_name("node-a", DRIVER, 0)
    api.edit_slice(name, lambda s: s["spec"]["devices"].pop())
    stray = build_slices("node-a", DRIVER, [{"name": "x"}], 1)[0]
    stray["metadata"]["name"] = "node-a-stray"
    api.create_slice(stray)
    p.notice("MODIFIED", api.slices[name])
    p.sync()
    assert set(api.slices) == {name} and len(api.slices[name]["spec"]["devices"]) == 16


def test_many_devices_many_slices_and_shrinking_deletes_the_extra_ones():
    api = FakeDraApi()
    p = SlicePublisher(api, "node-a", DRIVER)
    many = [dict(devs()[0], name=f"gpu-{i}") for i in range(130)]
    p.set_devices(many)
    p.sync()
    assert len(api.slices) == 3 and {s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()} == {3}
    p.set_devices(many[:10])
    p.sync()
    assert len(api.slices) == 1


def test_api_failure_is_retried_and_other_nodes_slices_untouched():
    api = FakeDraApi()
    other = build_slices("node-b", DRIVER, [{"name": "gpu-0"}], 3)[0]
    api.create_slice(other)
    p = SlicePublisher(api, "node-a", DRIVER)
    p.set_devices(devs())
    api.fail = 1
    assert not p.sync() and "injected" in p.last_error
    assert p.sync()  # dirty again: the next step retries
    assert set(api.slices) == {other["metadata"]["name"], slice_name("node-a", DRIVER, 0)}


def test_watch_notices_a_wipe_and_the_next_sync_republishes():
    api = FakeDraApi()
    p = SlicePublisher(api, "node-a", DRIVER, resync_s=1e9)
    p.set_devices(devs())
    p.sync()
    stop = threading.Event()
    t = threading.Thread(target=p.run_watch, args=(stop, 5), daemon=True)
    t.start()
    try:
        assert wait_for(lambda: api.calls.get("list_slices", 0) >= 2)
        p._dirty.clear()
        api.wipe_slices("node-a")
        assert p.wait_dirty(5)
        assert p.sync() and len(api.slices) == 1
    finally:
        stop.set()
        t.join(10)
