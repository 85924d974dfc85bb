"""``report.html``: one self-contained page per experiment (inline SVG plots), for packing runs (with where the
idle GPUs are) and for replay runs (delay against load, classes, teams, what-ifs)."""
