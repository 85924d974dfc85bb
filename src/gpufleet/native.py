"""Whether the optional C extension ``gpufleet._native`` is in use, and its functions where it is.

Why a module of its own: the extension is optional (``setup.py`` builds it where a C compiler is found; an install
without one takes the numpy paths, which give the same results), so every user of it asks here, and benchmarks and
tests can say which path they measured (``describe``).  ``GPUFLEET_NATIVE=0`` turns it off (to measure or test the
numpy path from the same install).
"""

from __future__ import annotations

import os
from collections.abc import Callable

measure: Callable[..., bool] | None = None  # DescentScore._measure's table path
frag_amount: Callable[..., bool] | None = None  # policies.paper.workload.frag_amount's table path
descent: Callable[..., bool] | None = None  # DescentScore's node and share scores of a few nodes, measure included
fgd: Callable[..., int] | None = None  # FGDScore's fragment decreases of a few nodes (the sigmoid stays in numpy)
fit: Callable[..., tuple[int, int, int] | None] | None = None  # the engine's one-pass filter phase (Scheduler._filter)
top: Callable[..., tuple[int, int] | None] | None = None  # Scheduler._pick's best score and its ties
REASON = ""
try:
    from . import _native  # type: ignore[attr-defined]  # compiled from _native.c; absent where it was not built
except ImportError as e:
    REASON = f"not built ({e})"
else:
    if os.environ.get("GPUFLEET_NATIVE", "1") == "0":
        REASON = "off (GPUFLEET_NATIVE=0)"
    else:
        measure = _native.measure
        # None where the extension was built from an older _native.c (an in-place build not redone): that path is
        # then numpy's, and the build says so (describe) rather than failing every import
        frag_amount = getattr(_native, "frag_amount", None)
        descent = getattr(_native, "descent", None)
        fgd = getattr(_native, "fgd", None)
        fit = getattr(_native, "fit", None)
        top = getattr(_native, "top", None)

ACTIVE = measure is not None


def describe() -> str:
    """One line for a benchmark's output: whether the C paths (the policies' measures and scores, the engine's fused
    filter phase and pick) or numpy's run."""
    if ACTIVE and (frag_amount is None or descent is None or fgd is None or fit is None or top is None):
        return ("native: on for the descent measure; frag_amount, the descent's or FGD's scores, the fused filters: numpy "
                "path (gpufleet._native built from an older _native.c: python setup.py build_ext --inplace)")
    if not ACTIVE:
        return f"native: {REASON}: numpy path"
    return "native: on (gpufleet._native: the descent measure and scores, frag_amount, FGD's deltas, the fused filters and pick)"


__all__ = ["ACTIVE", "REASON", "descent", "describe", "fgd", "fit", "frag_amount", "measure", "top"]
