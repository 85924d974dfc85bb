"""Test-only pause points, so that a fault drill can kill the agent in the middle of a kubelet call.

The moments that matter for an agent crash are narrow: an ``Allocate`` or a ``NodePrepareResources`` whose result
the agent has recorded (its checkpoint) but not yet returned to kubelet.  A drill cannot hit them by timing alone
(they last milliseconds), so the agent pauses there when told to, and the drill kills it while it sleeps.

Off unless the environment names a directory: ``GPUFLEET_AGENT_PAUSE_DIR``.  Even then nothing pauses until a drill
*arms* a point by writing ``<dir>/<point>`` (its text: the seconds to sleep).  The first call that reaches the point
takes the file (one call pauses per arming, whichever thread gets there first), writes ``<dir>/<point>.paused`` with
what it is doing (the pod or claim), then sleeps.  Production manifests never set the variable.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "GPUFLEET_AGENT_PAUSE_DIR"
POINTS = ("allocate", "prepare")  # device plugin Allocate, DRA NodePrepareResources: recorded, not yet answered


_sleep = time.sleep  # tests replace it


def pause(point: str, what: str) -> float:
    """Sleep if ``point`` is armed (see the module docstring); returns the seconds slept (0 when not armed)."""
    d = os.environ.get(ENV)
    if not d:
        return 0.0
    armed = Path(d) / point
    try:
        text = armed.read_text().strip()
        armed.unlink()  # atomic: of two calls that read it, one unlinks it, the other gets FileNotFoundError
    except OSError:
        return 0.0
    try:
        seconds = float(text or 30)
    except ValueError:
        log.error("pause point %s: %s holds %r, not seconds; not pausing", point, armed, text)
        return 0.0
    (Path(d) / f"{point}.paused").write_text(what)
    log.warning("test pause: %s paused for %.1f s in %s (%s is set)", point, seconds, what, ENV)
    _sleep(seconds)
    return seconds
