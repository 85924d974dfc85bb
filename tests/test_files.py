"""``gpufleet.files.replace_atomically``: the one atomic replace the agent's checkpoints, CDI specs, endpoint files
and ``recommend``'s patches share; a reader sees the old text or the new, never a part, and no temporary is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet import files


def test_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    files.replace_atomically(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_temporary_is_a_dot_file_of_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    files.replace_atomically(str(tmp_path / "claim.json"), "{}")
    assert seen == [f".claim.json.tmp.{os.getpid()}"]  # CDI caches skip dot files; two writers never share one


def test_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "spec"
    target.mkdir()  # a directory where the file should be: the rename fails
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        files.replace_atomically(target, "new")
    assert (target / "inside").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec"]


def test_fsync_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: calls.append(fd))
    files.replace_atomically(tmp_path / "a", "x")
    assert calls == []
    files.replace_atomically(tmp_path / "b", "y", fsync=True)
    assert len(calls) == 1 and (tmp_path / "b").read_text() == "y"
