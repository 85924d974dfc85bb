"""Dynamic Resource Allocation (resource.k8s.io/v1) in the engine: objects, CEL selectors, the allocator.

gpufleet's scheduler allocates ResourceClaims itself (structured parameters), with one engine for the
live scheduler, the simulator and ``explain``.  ``objects`` parses the API objects once, ``cel`` runs
DeviceClass and request selectors, ``allocator`` picks devices on one node with kube-scheduler's
semantics.  docs/dra.md says what is supported and what is refused.
"""
