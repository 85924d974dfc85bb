"""Kubernetes adapter: feeds the engine from the API server and binds its decisions.

The engine decides from a snapshot; this package builds that snapshot from
Node and Pod objects (raw JSON only here, at the edge), runs the scheduling
loop, writes the GPU assignment onto the pod with the Binding, and reports
failures as Kubernetes events.
"""
