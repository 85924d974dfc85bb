"""Trace-driven simulator: the same engine as the live scheduler, on a simulated clock.

No API server, no polling: the simulator builds a ``ClusterState`` from a node
list, turns trace rows into ``PodRequest``s and calls ``Scheduler.schedule``
synchronously, so every number it reports is what the real scheduler's code
would have decided.

Grouped by what each part is: ``traces`` (what is replayed), ``experiments`` (what is run on it),
``bounds`` (what the results are measured against) and ``report`` (``report.html``).
"""
