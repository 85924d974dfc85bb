"""Dynamic Resource Allocation in the live scheduler: DRA objects from list+watch (``cache``), the claim writes
before a Binding (``writer``), and the hooks the loop, its cache and its binder call (``live``)."""

from .cache import DraCache
from .live import LiveDra, with_dra
from .writer import ClaimWriter, ClaimWriteError

__all__ = ["ClaimWriteError", "ClaimWriter", "DraCache", "LiveDra", "with_dra"]
