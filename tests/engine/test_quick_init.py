"""``quick_frozen_init``: Assignment's and Decision's ``__init__`` fill ``__dict__`` at once; the instances must be
what the dataclass's generated ``__init__`` makes (a twin class keeps that one to compare with)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from gpufleet.engine.framework import Decision, GpuChoice
from gpufleet.engine.model import Assignment, PodRequest, quick_frozen_init
from gpufleet.engine.round import Attempt
from gpufleet.engine.status import Code, Status


def _twin(cls: type) -> type:
    """The same fields in a frozen dataclass with the generated ``__init__``."""
    return dataclasses.make_dataclass(cls.__name__, [(f.name, f.type, f) for f in dataclasses.fields(cls)], frozen=True)


CASES = [
    (Assignment, [dict(pod_key="a/b", node="n1", cpu_milli=1, memory_mib=2),
                  dict(pod_key="a/c", node="n2", cpu_milli=1_000, memory_mib=4_096, gpu_indices=(0, 3), gpu_milli=1_000,
                       gpu_memory_mib=(16_000, 16_000), priority=5, queue="q", pod_group="g", scalars=(("x", 1),),
                       claims=("ns/c",), dra_usage=(("gpu_milli", 500),)),
                  dict(pod_key="a/d", node="n3", cpu_milli=0, memory_mib=0, mig=((1, 2),), mig_profile="1g.10gb")]),
    (Decision, [dict(pod_key="a/b", status=Status.success()),
                dict(pod_key="a/b", status=Status.unschedulable("no", plugin="p"), score=3.5, feasible_nodes=7)]),
    (Status, [dict(code=Code.SUCCESS), dict(code=Code.UNSCHEDULABLE, reasons=("a", "b"), plugin="p")]),
    (GpuChoice, [dict(gpu_indices=(1, 2)), dict(mig=((0, 1),))]),
    (Attempt, [dict(request=PodRequest("p", cpu_milli=1), decision=Decision(pod_key="default/p", status=Status.success())),
               dict(request=PodRequest("q"), decision=Decision(pod_key="default/q", status=Status.unschedulable("no")),
                    held_room=True, note="n", until=3.0, made_room=True)]),
]


@pytest.mark.parametrize("cls, kwargs", CASES)
def test_instances_are_what_the_generated_init_makes(cls: type, kwargs: list[dict]) -> None:
    twin = _twin(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(cls).parameters) == names
    for f in dataclasses.fields(cls):
        assert inspect.signature(cls).parameters[f.name].default == (
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
    for kw in kwargs:
        got, want = cls(**kw), twin(**kw)
        assert got.__dict__ == want.__dict__ and list(got.__dict__) == names
        assert repr(got).partition("(")[2] == repr(want).partition("(")[2]
        assert got == cls(**kw) and hash(got) == hash(cls(**kw))
        assert cls(*[kw.get(n, getattr(got, n)) for n in names]) == got  # positionally too
        assert dataclasses.replace(got, **{names[0]: getattr(got, names[0])}) == got
        assert pickle.loads(pickle.dumps(got)) == got
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(got, names[0], "x")
    if "pod_key" in names:
        with pytest.raises(TypeError):
            cls(pod_key="a/b")  # a required field missing
    with pytest.raises(TypeError):
        cls(**kwargs[0], nonsense=1)


def test_refuses_what_it_cannot_copy() -> None:
    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Post:
        x: int = 0

        def __post_init__(self) -> None:
            pass

    for cls in (Factory, Post):
        with pytest.raises(TypeError):
            quick_frozen_init(cls)
