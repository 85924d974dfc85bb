"""One way to replace a file so that no reader ever sees half of it.

Why: the device plugin's checkpoint, the DRA driver's checkpoint, CDI specs, the agent endpoint's hand-over files
and ``gpufleet recommend``'s patches are all read by another process (kubelet, containerd, the agent, a person's
``kubectl apply``) while they are rewritten; each wrote its own copy of "write a temporary file, rename it over".
Here once: the temporary file is a dot file beside the target (CDI caches and globbing readers skip it) named with
this process's id (two processes that write the same file never share one), and ``fsync`` is asked for where a
record must survive a power loss before the caller reports success (the DRA driver's prepared claims).
"""

from __future__ import annotations

import os
from pathlib import Path


def replace_atomically(path: str | os.PathLike[str], text: str, *, fsync: bool = False) -> None:
    """Write ``text`` to ``path`` by a rename over it; OSError (the temporary file removed) if it cannot."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
