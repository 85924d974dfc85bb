"""Known GPU models: memory size and MIG profiles.

Used to model a node when only its product name is known (GPU Feature
Discovery labels, trace node lists) and to reject requests no GPU can satisfy.
The Alibaba trace's G1/G2/G3 codes are undisclosed; their memory is unknown and
is assumed to be 32 GiB (the trace requests no GPU memory, so this only matters
for memory-based fractional requests against those nodes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int
    mig_profiles: tuple[tuple[str, int], ...] = ()  # (profile, memory_mib)


_A100_80_MIG = (("1g.10gb", 9728), ("1g.20gb", 19968), ("2g.20gb", 19968), ("3g.40gb", 40192), ("4g.40gb", 40192), ("7g.80gb", 80896))
_A100_40_MIG = (("1g.5gb", 4864), ("1g.10gb", 9856), ("2g.10gb", 9856), ("3g.20gb", 19968), ("4g.20gb", 19968), ("7g.40gb", 40192))
_H100_80_MIG = (("1g.10gb", 9984), ("1g.20gb", 19968), ("2g.20gb", 19968), ("3g.40gb", 40448), ("4g.40gb", 40448), ("7g.80gb", 80896))

MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in [
        GpuModel("NVIDIA-A100-SXM4-80GB", 81920, _A100_80_MIG),
        GpuModel("NVIDIA-A100-SXM4-40GB", 40960, _A100_40_MIG),
        GpuModel("NVIDIA-A100-PCIE-40GB", 40960, _A100_40_MIG),
        GpuModel("NVIDIA-A100-80GB-PCIe", 81920, _A100_80_MIG),
        GpuModel("NVIDIA-H100-80GB-HBM3", 81559, _H100_80_MIG),
        GpuModel("NVIDIA-H100-PCIe", 81559, _H100_80_MIG),
        GpuModel("NVIDIA-H200", 143771, ()),
        GpuModel("Tesla-T4", 15360),
        GpuModel("NVIDIA-A10", 23028),
        GpuModel("NVIDIA-L4", 23034),
        GpuModel("Tesla-V100-SXM2-16GB", 16384),
        GpuModel("Tesla-V100-SXM2-32GB", 32768),
        GpuModel("Tesla-P100-PCIE-16GB", 16384),
        # Alibaba openb trace codes
        GpuModel("T4", 15360),
        GpuModel("P100", 16384),
        GpuModel("V100M16", 16384),
        GpuModel("V100M32", 32768),
        GpuModel("A10", 23028),
        GpuModel("G1", 32768),
        GpuModel("G2", 32768),
        GpuModel("G3", 32768),
    ]
}

LARGEST_GPU_MEMORY_MIB = max(m.memory_mib for m in MODELS.values())


def lookup(name: str) -> GpuModel | None:
    """Find a model by exact name, then by a case-insensitive, separator-blind match."""
    if name in MODELS:
        return MODELS[name]
    key = name.lower().replace(" ", "-").replace("_", "-")
    for m in MODELS.values():
        if m.name.lower() == key:
            return m
    return None


def mig_profile_memory_mib(profile: str) -> int | None:
    """Memory of a MIG profile as any known model defines it (largest match)."""
    best = None
    for m in MODELS.values():
        for p, mem in m.mig_profiles:
            if p == profile:
                best = max(best or 0, mem)
    return best


MIG_SLICES = 7  # compute slices of a MIG-capable GPU (A100, H100, H200)
_MIG_RE = re.compile(r"^(\d+)g\.")


def mig_fraction(profile: str) -> float:
    """``3g.40gb`` -> 3/7 of a GPU; unknown shapes count as a whole GPU."""
    m = _MIG_RE.match(profile)
    return min(1.0, int(m.group(1)) / MIG_SLICES) if m else 1.0
