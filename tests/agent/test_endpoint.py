"""The device-plugin endpoint (``gpufleet agent-endpoint``): kubelet's connection outlives the agent.

A fake kubelet (real Registration server, real sockets) and the agent's real ``DevicePlugin`` servers as the
backend: the agent stopped and started again must not end kubelet's ListAndWatch stream; a call made while it is
away waits for it; a call it died in the middle of is sent again; its refusals pass through; kubelet restarts are
followed."""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures

import grpc
import pytest

from gpufleet.agent import endpoint as ep
from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.deviceplugin import api_pb2_grpc as pbg
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import DevicePlugin
from gpufleet.agent.podsource import pick

from .conftest import wait_for
from .test_api_restart_admission import NODE, share

H100 = FakeBackend("h100-nvlink").gpus()
RES = "nvidia.com/gpu"


def alloc(ids):
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


@pytest.fixture
def epdir(sockdir):
    d = os.path.join(sockdir, "ep")
    os.makedirs(d)
    return d


@pytest.fixture
def endpoint(sockdir, epdir, kubelet):
    e = ep.Endpoint(sockdir, epdir, agent_wait_s=5.0)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            e.step()
            stop.wait(ep.POLL_S)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield e
    stop.set()
    t.join(5)
    e.close()


class OneShare:
    """The API as the agent sees it: one 250-milli share bound here, assigned GPU 3."""

    def pending_assignment(self, resource, count, exclude):
        return pick([share("p", 3, 1)], NODE, resource, count, exclude)


def agent(epdir, state) -> DevicePlugin:
    """The agent's device plugin as it runs with --endpoint-dir: its socket and manifest in the endpoint dir."""
    p = DevicePlugin(RES, H100, epdir, slots=4, state_dir=state, pods=OneShare())
    p.start()
    ep.write_manifest(epdir, [(RES, p.endpoint)])
    return p


def test_kubelet_keeps_its_connection_while_the_agent_restarts_and_a_call_waits_for_it(sockdir, epdir, kubelet, endpoint):
    a1 = agent(epdir, sockdir)
    assert wait_for(lambda: any(r.resource_name == RES for r in kubelet.registered)), "endpoint did not register"
    (req,) = kubelet.registered
    assert req.endpoint == a1.endpoint and req.options.get_preferred_allocation_available
    assert os.path.exists(os.path.join(sockdir, a1.endpoint))  # kubelet dials the endpoint's socket, not the agent's
    assert wait_for(lambda: set(ep.read_stamp(epdir)) == {RES})  # written right after kubelet's answer
    stamp = ep.read_stamp(epdir)
    ch, stub = kubelet.plugin(RES)
    stream = stub.ListAndWatch(pb.Empty())
    first = next(stream)
    assert len(first.devices) == 8 * 4 and all(d.health == "Healthy" for d in first.devices)

    a1.stop(grace_s=0)  # the agent is gone (its socket file stays behind, as after a kill)
    answer: dict = {}

    def call():
        try:
            answer["r"] = stub.Allocate(alloc(["GPU-h100-03::1"]), timeout=10)  # kubelet, steered to GPU 3
        except grpc.RpcError as exc:
            answer["err"] = exc

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.6)
    assert t.is_alive() and not answer, "the call must wait for the agent, not fail"
    a2 = agent(epdir, sockdir)  # the restarted agent
    t.join(10)
    assert "r" in answer, answer
    envs = answer["r"].container_responses[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-03" and envs["GPUFLEET_POD"] == "default/p"
    # kubelet's stream never ended: it gets the new agent's list on the same stream; nothing registered again
    again = next(stream)
    assert len(again.devices) == 8 * 4
    assert len(kubelet.registered) == 1
    assert ep.read_stamp(epdir) == stamp
    a2.set_health({3: False})  # health flows through as before
    assert [d.ID for d in next(stream).devices if d.health == "Unhealthy"] == [f"GPU-h100-03::{k}" for k in range(4)]
    stream.cancel()
    ch.close()
    a2.stop(grace_s=0)


class Backend(pbg.DevicePluginServicer):
    """A stand-in agent whose Allocate can be held, to stop the server in the middle of it."""

    def __init__(self, name: str, hold: threading.Event | None = None, refuse: str = "") -> None:
        self.name, self.hold, self.refuse, self.calls = name, hold, refuse, 0
        self.entered = threading.Event()

    def ListAndWatch(self, request, context):  # noqa: N802
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="d0", health="Healthy")])
        while context.is_active():
            time.sleep(0.05)

    def Allocate(self, request, context):  # noqa: N802
        self.calls += 1
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(10)
        if self.refuse:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refuse)
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"BY": self.name})])


def serve(epdir: str, b: Backend) -> grpc.Server:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_DevicePluginServicer_to_server(b, srv)
    path = os.path.join(epdir, "x.sock")
    if os.path.exists(path):
        os.unlink(path)
    srv.add_insecure_port(f"unix://{path}")
    srv.start()
    ep.write_manifest(epdir, [(RES, "x.sock")])
    return srv


DYING_AGENT = """
import os, sys, time
from concurrent import futures
import grpc
from gpufleet.agent.deviceplugin import api_pb2 as pb, api_pb2_grpc as pbg

class Dying(pbg.DevicePluginServicer):
    def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="d0", health="Healthy")])
        while context.is_active():
            time.sleep(0.05)

    def Allocate(self, request, context):
        open(sys.argv[2], "w").close()
        time.sleep(60)  # killed here, the answer never sent

srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
pbg.add_DevicePluginServicer_to_server(Dying(), srv)
srv.add_insecure_port("unix://" + sys.argv[1])
srv.start()
srv.wait_for_termination()
"""


def test_a_call_the_agent_died_in_is_sent_again_to_the_next_agent(sockdir, epdir, kubelet, endpoint):
    import signal
    import subprocess
    import sys

    entered = os.path.join(sockdir, "entered")
    proc = subprocess.Popen([sys.executable, "-c", DYING_AGENT, os.path.join(epdir, "x.sock"), entered])
    try:
        assert wait_for(lambda: os.path.exists(os.path.join(epdir, "x.sock")))
        ep.write_manifest(epdir, [(RES, "x.sock")])
        assert wait_for(lambda: kubelet.registered)
        ch, stub = kubelet.plugin(RES)
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", stub.Allocate(alloc(["d0"]), timeout=15)))
        t.start()
        assert wait_for(lambda: os.path.exists(entered))
        os.kill(proc.pid, signal.SIGKILL)  # dies with the call in flight
        proc.wait(5)
        time.sleep(0.5)
        assert t.is_alive() and not out
        second = Backend("second")
        s2 = serve(epdir, second)
        t.join(10)
        assert out["r"].container_responses[0].envs["BY"] == "second" and second.calls == 1
        ch.close()
        s2.stop(0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_agents_refusal_passes_through_unchanged_and_is_not_sent_again(sockdir, epdir, kubelet, endpoint):
    b = Backend("guard", refuse="pod default/p: GPU 0 is used by default/q")
    s = serve(epdir, b)
    assert wait_for(lambda: kubelet.registered)
    ch, stub = kubelet.plugin(RES)
    with pytest.raises(grpc.RpcError) as e:
        stub.Allocate(alloc(["d0"]), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "GPU 0 is used by default/q" in e.value.details()
    assert b.calls == 1
    ch.close()
    s.stop(0)


def test_an_agent_that_does_not_come_back_fails_the_call_after_the_wait(sockdir, epdir, kubelet):
    e = ep.Endpoint(sockdir, epdir, agent_wait_s=0.8)
    s = serve(epdir, Backend("only"))
    assert wait_for(lambda: (e.step(), bool(kubelet.registered))[1])
    s.stop(0)
    ch, stub = kubelet.plugin(RES)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(alloc(["d0"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "has not served Allocate for 1 s" in err.value.details()
    assert 0.7 <= time.monotonic() - t0 < 5
    ch.close()
    e.close()


def test_kubelet_restart_and_a_resource_the_agent_dropped(sockdir, epdir, kubelet, endpoint):
    a = agent(epdir, sockdir)
    assert wait_for(lambda: len(kubelet.registered) == 1)
    kubelet.stop()  # kubelet restarts: a new kubelet.sock, and it wipes the sockets in its directory
    os.unlink(os.path.join(sockdir, a.endpoint))
    kubelet.registered.clear()
    kubelet.start()
    assert wait_for(lambda: len(kubelet.registered) == 1), "not registered with the new kubelet"
    ch, stub = kubelet.plugin(RES)
    assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 32
    ch.close()
    ep.write_manifest(epdir, [])  # the agent no longer serves the resource (a new configuration)
    assert wait_for(lambda: not os.path.exists(os.path.join(sockdir, a.endpoint)))
    assert ep.read_stamp(epdir) == {}
    a.stop(grace_s=0)


def test_nothing_is_registered_before_the_agent_has_said_what_it_serves(sockdir, epdir, kubelet):
    e = ep.Endpoint(sockdir, epdir)
    for _ in range(5):
        e.step()
    assert not kubelet.registered  # no manifest
    ep.write_manifest(epdir, [(RES, "x.sock")])  # a manifest, but no agent answering on it
    for _ in range(5):
        e.step()
        time.sleep(0.02)
    assert not kubelet.registered and not os.path.exists(os.path.join(sockdir, "x.sock"))
    e.close()


def test_endpoint_flags():
    import argparse

    p = argparse.ArgumentParser()
    ep.add_arguments(p)
    assert ep.run(p.parse_args(["--agent-wait-s", "0"])) == 2


def test_agent_killed_in_the_middle_of_an_allocate_costs_kubelet_nothing(tmp_path):
    """The drill's fault on processes: `gpufleet agent --endpoint-dir` beside `gpufleet agent-endpoint`; the agent is
    kill -9'd while it sleeps in an Allocate (test pause point, answer recorded, not sent) and started again: kubelet's
    stream never ends, nothing registers again, and the Allocate kubelet sent before the kill is answered."""
    import signal
    import subprocess
    import sys
    import tempfile

    from gpufleet.agent import pause

    from .conftest import FakeKubelet

    d = tempfile.mkdtemp(dir="/tmp", prefix="ge")
    epd, pause_dir = os.path.join(d, "ep"), os.path.join(d, "pause")
    os.makedirs(pause_dir)
    kubelet = FakeKubelet(d).start()
    env = dict(os.environ, NODE_NAME="", **{pause.ENV: pause_dir})
    logs = [open(tmp_path / n, "w") for n in ("endpoint.log", "agent1.log", "agent2.log")]
    gf = [sys.executable, "-m", "gpufleet.cli.main"]
    agent_cmd = gf + ["agent", "--nvml", "fake:h100-nvlink", "--device-plugin-dir", d, "--state-dir", os.path.join(d, "st"),
                      "--endpoint-dir", epd, "--metrics-addr", "", "--interval", "0.2", "--shares-per-gpu", "1"]
    endpoint = subprocess.Popen(gf + ["agent-endpoint", "--device-plugin-dir", d, "--endpoint-dir", epd],
                                env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    procs = [endpoint, subprocess.Popen(agent_cmd, env=env, stdout=logs[1], stderr=subprocess.STDOUT)]
    try:
        assert wait_for(lambda: len(kubelet.registered) == 1, 30), "the endpoint did not register"
        assert kubelet.registered[0].resource_name == RES
        ch, stub = kubelet.plugin(RES)
        stream = stub.ListAndWatch(pb.Empty())
        assert len(next(stream).devices) == 8
        with open(os.path.join(pause_dir, "allocate"), "w") as f:
            f.write("30")
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", stub.Allocate(alloc(["GPU-h100-02"]), timeout=60)))
        t.start()
        assert wait_for(lambda: os.path.exists(os.path.join(pause_dir, "allocate.paused")), 20)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(5)
        procs.append(subprocess.Popen(agent_cmd, env=env, stdout=logs[2], stderr=subprocess.STDOUT))
        t.join(45)
        assert out["r"].container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-02"
        assert len(kubelet.registered) == 1  # kubelet never lost the plugin: no second registration
        assert len(next(stream).devices) == 8  # the new agent's list, on the stream kubelet opened before the kill
        # a DaemonSet update stops both: the endpoint serves kubelet until the agent has drained and stopped
        endpoint.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert endpoint.poll() is None
        procs[2].send_signal(signal.SIGTERM)
        assert procs[2].wait(20) == 0
        assert endpoint.wait(10) == 0
        assert not os.path.exists(os.path.join(d, kubelet.registered[0].endpoint))  # its socket removed
        stream.cancel()
        ch.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for f in logs:
            f.close()
        kubelet.stop()
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def test_the_agent_serves_the_endpoint_announces_its_registration_and_says_when_nobody_registers(
        sockdir, epdir, kubelet, monkeypatch, caplog):
    from gpufleet.agent import main
    from gpufleet.agent.config import AgentConfig

    a = main.Agent(FakeBackend("h100-nvlink"), AgentConfig(), sockdir, os.path.join(sockdir, "st"), endpoint_dir=epdir)
    said: list[str] = []
    a.announce = lambda when: said.append(when) or True
    monkeypatch.setattr(main, "ENDPOINT_SILENT_S", 0.0)
    a.register()
    a.register()
    assert ep.read_manifest(epdir) == [(RES, a.plugins[0].endpoint)]
    assert not kubelet.registered and not said and not a.endpoint_registered()  # the agent never registers itself
    assert "no device-plugin endpoint has registered nvidia.com/gpu" in caplog.text and epdir in caplog.text
    e = ep.Endpoint(sockdir, epdir)
    assert wait_for(lambda: (e.step(), bool(kubelet.registered))[1])
    assert wait_for(lambda: (a.register(), bool(said))[1])  # the endpoint's registration, announced on the Node
    assert said == [ep.read_stamp(epdir)[RES]] and a.endpoint_registered()
    e.close()
    a.stop_plugins()


def test_endpoint_dir_with_dra_is_a_usage_error(capsys):
    import argparse

    from gpufleet.agent import main

    p = argparse.ArgumentParser()
    main.add_arguments(p)
    args = p.parse_args(["--dra", "--endpoint-dir", "/tmp/x", "--nvml", "fake:h100-nvlink", "--node-name", "n"])
    assert main.run(args) == 2
    assert "--endpoint-dir is for the device plugin" in capsys.readouterr().err
