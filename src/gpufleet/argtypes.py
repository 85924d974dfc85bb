"""Argument types for every ``gpufleet`` sub-command: each number finite and within a stated range.

argparse turns the ``ArgumentTypeError`` raised here into one line naming the
flag (``gpufleet simulate: argument --jobs: must be an integer >= 1, got 0``)
and exit status 2, before any work starts.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import Callable


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be an integer in {_range(lo, hi)}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def float_range(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """A finite float in [lo, hi] (or (lo, hi] with ``lo_open``); nan and inf are refused."""

    def parse(text: str) -> float:
        try:
            v = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be in {_range(lo, hi, lo_open)}, got {text.strip()}")
        return v

    parse.__name__ = "number"
    return parse


def _range(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    return f"{'(' if lo_open else '['}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"


def host_port(text: str) -> str:
    """HOST:PORT (HOST may be empty or a [v6] address); the port 0-65535; '' (off) passes."""
    if text == "":
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def output_file(flag: str, path: str) -> None:
    """Raise if ``path`` cannot be written, before any work: its directory must exist and be writable."""
    from .engine.errors import UsageError

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory {parent} does not exist")
    try:  # probe for real: root ignores mode bits, read-only mounts do not
        if p.exists():
            with open(p, "a"):
                pass
        else:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".gpufleet-write-")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write there: {exc.strerror or exc}") from None
