"""``request_copy`` (the fast ``replace`` by ``__dict__``) must give what ``dataclasses.replace`` gives, key and
pickle included, and leave nothing but fields in a request's ``__dict__``."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from gpufleet.engine.model import PodRequest, request_copy

pytestmark = pytest.mark.unit


def test_key_follows_the_fields_and_is_not_kept() -> None:
    r = PodRequest(name="a", namespace="ns", gpu_count=1, gpu_milli=500)
    assert r.key == "ns/a"
    assert set(vars(r)) == {f.name for f in dataclasses.fields(PodRequest)}
    assert dataclasses.replace(r, name="b").key == "ns/b"


@pytest.mark.parametrize("changes", [{"name": "b"}, {"namespace": "other"}, {"gpu_milli": 250}, {}])
def test_copy_is_replace_and_makes_its_own_key(changes: dict) -> None:
    r = PodRequest(name="a", namespace="ns", cpu_milli=100, gpu_count=1, gpu_milli=500)
    _ = r.key  # cached before the copy
    out = request_copy(r, **changes)
    want = dataclasses.replace(r, **changes)
    assert out == want
    assert vars(out) == vars(want)
    assert out.key == want.key == f"{want.namespace}/{want.name}"
    assert pickle.loads(pickle.dumps(out)).key == want.key
    assert r.key == "ns/a"
