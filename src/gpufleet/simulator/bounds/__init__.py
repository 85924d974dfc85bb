"""What the packing results are measured against: the offline bounds (MIP and LP: the least any placement could
leave idle) and where the idle GPUs are (saturation, holes by what the GPU holds, the repack yardstick)."""
