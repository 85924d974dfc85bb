"""Which gpufleet this is: the package version and, from a git checkout, the commit.

Reports and ``gpufleet --version`` carry both so that a figure can be traced to
the code that made it.  The commit is looked up once, with a short timeout, and
is simply absent outside a git checkout (an installed wheel).
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from pathlib import Path

from . import __version__


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's short commit (with ``-dirty`` when it has local changes), or None."""
    return start_git_commit()()


def start_git_commit() -> Callable[[], str | None]:
    """Start looking the commit up (two ``git`` processes) and return what waits for the answer: a command
    that reports it at its end starts the lookup first and takes the answer then, instead of waiting for git
    after its work (``gpufleet simulate``: 0.1-0.2 s of wall clock)."""
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return lambda: None
    try:
        procs = [subprocess.Popen(["git", "-C", str(root), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
                 for args in (["rev-parse", "--short=12", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])]
    except OSError:
        return lambda: None

    @functools.lru_cache(maxsize=1)
    def result() -> str | None:
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.communicate()
                return None
            if p.returncode != 0:
                return None
            outs.append(out.strip())
        head, dirty = outs
        return (head + ("-dirty" if dirty else "")) or None

    return result


def version_string() -> str:
    commit = git_commit()
    return f"gpufleet {__version__}" + (f" (commit {commit})" if commit else "")
