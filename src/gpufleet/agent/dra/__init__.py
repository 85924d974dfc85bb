"""The node agent as a Dynamic Resource Allocation (``resource.k8s.io/v1``) driver: ``gpufleet agent --dra``.

Device-plugin nodes keep working as before; a node whose agent runs with
``--dra`` publishes its GPUs as ResourceSlices of the driver ``gpu.gpufleet.io``
(attribute names as NVIDIA's DRA driver publishes them, so any allocator
can use them) and serves kubelet's DRA plugin API.  See docs/dra.md.
The ``*_pb2*`` modules are generated from the ``.proto`` files next to them.
"""
