"""The experiments ``gpufleet simulate`` runs: packing (the FGD paper's), the replay on the trace's clock (with its
waiting pods, team queues and capacity what-ifs), the queues experiment and the spot replay.  Each drives the
real engine; the replay's pods go through the live loop's scheduling round (``engine.round``)."""
