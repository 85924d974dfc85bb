"""kubelet PodResources API v1 (List): the .proto and its generated stubs, committed."""
