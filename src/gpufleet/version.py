"""Which gpufleet this is: the package version and, from a git checkout, the commit.

Reports and ``gpufleet --version`` carry both so that a figure can be traced to
the code that made it.  The commit is looked up once, with a short timeout, and
is simply absent outside a git checkout (an installed wheel).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from . import __version__


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's short commit (with ``-dirty`` when it has local changes), or None."""
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("-dirty" if dirty else "")) or None


def version_string() -> str:
    commit = git_commit()
    return f"gpufleet {__version__}" + (f" (commit {commit})" if commit else "")
