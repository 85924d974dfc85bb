"""A fake kubelet for the agent tests: a real gRPC Registration server on a real unix socket."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent import futures

import grpc
import pytest

from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.deviceplugin import api_pb2_grpc as pbg


class FakeKubelet(pbg.RegistrationServicer):
    def __init__(self, sock_dir: str):
        self.sock_dir = sock_dir
        self.sock = os.path.join(sock_dir, "kubelet.sock")
        self.registered: list[pb.RegisterRequest] = []
        self.server = None

    def Register(self, request, context):  # noqa: N802
        self.registered.append(request)
        return pb.Empty()

    def start(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.sock}")
        self.server.start()
        return self

    def stop(self):
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def plugin(self, resource: str):
        """A device-plugin client for the endpoint a resource registered with (as kubelet dials it)."""
        req = next(r for r in reversed(self.registered) if r.resource_name == resource)
        ch = grpc.insecure_channel(f"unix://{os.path.join(self.sock_dir, req.endpoint)}")
        grpc.channel_ready_future(ch).result(timeout=5)
        return ch, pbg.DevicePluginStub(ch)


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(dir="/tmp", prefix="gf")  # short: unix socket paths are limited to ~107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(sockdir):
    k = FakeKubelet(sockdir).start()
    yield k
    k.stop()


def wait_for(cond, timeout_s: float = 10.0, step_s: float = 0.05) -> bool:
    end = time.time() + timeout_s
    while time.time() < end:
        if cond():
            return True
        time.sleep(step_s)
    return False
