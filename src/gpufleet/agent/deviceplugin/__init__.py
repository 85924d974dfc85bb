"""kubelet device-plugin API v1beta1: the .proto and its generated gRPC stubs (committed, so runtime needs only grpcio)."""
