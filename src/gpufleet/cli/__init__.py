"""Command-line entry points (``gpufleet ...``): thin wiring of the adapters."""
