"""``PodRequest.key`` is cached on the instance; ``request_copy`` (the fast ``replace``) must not carry a cached key
over to a copy under another name or namespace, and must give what ``dataclasses.replace`` gives."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from gpufleet.engine.model import PodRequest, request_copy

pytestmark = pytest.mark.unit


def test_key_is_cached_and_follows_the_fields() -> None:
    r = PodRequest(name="a", namespace="ns", gpu_count=1, gpu_milli=500)
    assert r.key == "ns/a"
    assert r.key is r.key
    assert dataclasses.replace(r, name="b").key == "ns/b"


@pytest.mark.parametrize("changes", [{"name": "b"}, {"namespace": "other"}, {"gpu_milli": 250}, {}])
def test_copy_is_replace_and_makes_its_own_key(changes: dict) -> None:
    r = PodRequest(name="a", namespace="ns", cpu_milli=100, gpu_count=1, gpu_milli=500)
    _ = r.key  # cached before the copy
    out = request_copy(r, **changes)
    want = dataclasses.replace(r, **changes)
    assert out == want
    assert out.key == want.key == f"{want.namespace}/{want.name}"
    assert pickle.loads(pickle.dumps(out)).key == want.key
    assert r.key == "ns/a"
