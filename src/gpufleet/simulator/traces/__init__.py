"""What the simulator replays: trace readers (the Alibaba 2023 and 2025 traces, the GFS-shaped spot workload),
the workload a replay runs (arrivals, run times, offered load), and what some traces need beside the engine
(per-node limits, DRA-shaped requests)."""
