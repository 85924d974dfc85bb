"""Reading Alibaba ``openb`` traces (node lists and pod lists).

Pod lists come in an 11-column form (``name,cpu_milli,memory_mib,num_gpu,
gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``)
and a 5-column form (the first five).  Node lists are ``sn,cpu_milli,
memory_mib,gpu,model``.  A broken row is an error naming the file, the line
and the field, unless the caller asks to skip bad rows, in which case they are
counted and reported: nothing silently changes the experiment.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

from ..engine.errors import GpufleetError
from ..engine.gpu_models import lookup
from ..engine.model import GPU_MILLI, Gpu, Node, PodRequest

POD_COLUMNS_FULL = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)
POD_COLUMNS_SHORT = POD_COLUMNS_FULL[:5]
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
MAX_GPUS_PER_NODE = 16


class TraceError(GpufleetError):
    def __init__(self, path: str, line: int, field: str, message: str):
        self.path, self.line, self.field = path, line, field
        super().__init__(f"{path}:{line}: field {field}: {message}")


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None

    def request(self, name: str | None = None) -> PodRequest:
        """The engine request: num_gpu whole GPUs, or one GPU share when gpu_milli < 1000."""
        if self.num_gpu == 0:
            count, milli = 0, 0
        elif self.num_gpu == 1:
            count, milli = 1, self.gpu_milli
        else:
            count, milli = self.num_gpu, GPU_MILLI
        return PodRequest(
            name=name or self.name,
            namespace="trace",
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu_count=count,
            gpu_milli=milli,
            gpu_models_allow=frozenset(self.gpu_spec) if self.gpu_spec else None,
        )


@dataclass
class Trace:
    name: str
    pods: list[TracePod]
    skipped_rows: list[str] = field(default_factory=list)


def _int(path: str, line: int, col: str, raw: str, minimum: int = 0, optional: bool = False) -> int | None:
    raw = (raw or "").strip()
    if raw == "" and optional:
        return None
    try:
        v = int(raw)
    except ValueError:
        try:
            f = float(raw)
        except ValueError:
            raise TraceError(path, line, col, f"expected an integer, got {raw!r}") from None
        if f != int(f):
            raise TraceError(path, line, col, f"expected an integer, got {raw!r}") from None
        v = int(f)
    if v < minimum:
        raise TraceError(path, line, col, f"must be >= {minimum}, got {v}")
    return v


def _open_rows(path: Path, expected: tuple[tuple[str, ...], ...]) -> tuple[list[str], Iterator[list[str]]]:
    f = open(path, newline="")
    reader = csv.reader(f)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(str(path), 1, "header", "file is empty") from None
    header = [h.strip() for h in header]
    if tuple(header) not in expected:
        raise TraceError(str(path), 1, "header", f"unexpected columns {header}; expected one of {[list(e) for e in expected]}")
    return header, reader


def load_pods(path: str | Path, skip_bad_rows: bool = False) -> Trace:
    path = Path(path)
    header, reader = _open_rows(path, (POD_COLUMNS_FULL, POD_COLUMNS_SHORT))
    pods: list[TracePod] = []
    skipped: list[str] = []
    seen: set[str] = set()
    p = str(path)
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        try:
            if len(row) != len(header):
                raise TraceError(p, lineno, "row", f"expected {len(header)} columns, got {len(row)}")
            d = dict(zip(header, row))
            name = d["name"].strip()
            if not name:
                raise TraceError(p, lineno, "name", "empty")
            if name in seen:
                raise TraceError(p, lineno, "name", f"duplicate pod name {name!r}")
            num_gpu = _int(p, lineno, "num_gpu", d["num_gpu"])
            gpu_milli = _int(p, lineno, "gpu_milli", d["gpu_milli"])
            assert num_gpu is not None and gpu_milli is not None
            if num_gpu > MAX_GPUS_PER_NODE:
                raise TraceError(p, lineno, "num_gpu", f"{num_gpu} GPUs is more than any node has")
            if gpu_milli > GPU_MILLI:
                raise TraceError(p, lineno, "gpu_milli", f"must be <= 1000, got {gpu_milli}")
            if num_gpu > 0 and gpu_milli == 0:
                raise TraceError(p, lineno, "gpu_milli", "a GPU pod needs gpu_milli > 0")
            if num_gpu == 0 and gpu_milli > 0:
                raise TraceError(p, lineno, "gpu_milli", "gpu_milli set on a pod without GPUs")
            spec_raw = d.get("gpu_spec", "").strip()
            spec = tuple(s.strip() for s in spec_raw.split("|") if s.strip()) if spec_raw and spec_raw.lower() != "nan" else ()
            ct = _int(p, lineno, "creation_time", d.get("creation_time", ""), optional=True)
            dt = _int(p, lineno, "deletion_time", d.get("deletion_time", ""), optional=True)
            stt = _int(p, lineno, "scheduled_time", d.get("scheduled_time", ""), optional=True)
            if ct is not None and dt is not None and dt < ct:
                raise TraceError(p, lineno, "deletion_time", f"{dt} is before creation_time {ct}")
            pods.append(
                TracePod(
                    name=name,
                    cpu_milli=_int(p, lineno, "cpu_milli", d["cpu_milli"]),  # type: ignore[arg-type]
                    memory_mib=_int(p, lineno, "memory_mib", d["memory_mib"]),  # type: ignore[arg-type]
                    num_gpu=num_gpu,
                    gpu_milli=gpu_milli,
                    gpu_spec=spec,
                    qos=d.get("qos", "").strip(),
                    creation_time=ct,
                    deletion_time=dt,
                    scheduled_time=stt,
                )
            )
            seen.add(name)
        except TraceError as exc:
            if not skip_bad_rows:
                raise
            skipped.append(str(exc))
    return Trace(name=path.stem, pods=pods, skipped_rows=skipped)


def load_nodes(path: str | Path, skip_bad_rows: bool = False) -> list[Node]:
    path = Path(path)
    header, reader = _open_rows(path, (NODE_COLUMNS,))
    nodes: list[Node] = []
    seen: set[str] = set()
    p = str(path)
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        try:
            if len(row) != len(header):
                raise TraceError(p, lineno, "row", f"expected {len(header)} columns, got {len(row)}")
            d = dict(zip(header, row))
            name = d["sn"].strip()
            if not name or name in seen:
                raise TraceError(p, lineno, "sn", f"empty or duplicate node name {name!r}")
            ngpu = _int(p, lineno, "gpu", d["gpu"])
            assert ngpu is not None
            if ngpu > MAX_GPUS_PER_NODE:
                raise TraceError(p, lineno, "gpu", f"{ngpu} GPUs on one node is more than supported ({MAX_GPUS_PER_NODE})")
            model = d["model"].strip()
            if ngpu and (not model or model.lower() == "nan"):
                raise TraceError(p, lineno, "model", "a GPU node needs a GPU model")
            gm = lookup(model) if ngpu else None
            mem = gm.memory_mib if gm else 32768
            gpus = tuple(Gpu(j, f"{name}-gpu{j}", model, mem) for j in range(ngpu))
            nodes.append(
                Node(
                    name=name,
                    cpu_milli=_int(p, lineno, "cpu_milli", d["cpu_milli"], minimum=1),  # type: ignore[arg-type]
                    memory_mib=_int(p, lineno, "memory_mib", d["memory_mib"], minimum=1),  # type: ignore[arg-type]
                    gpus=gpus,
                    labels={"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": model} if ngpu else {})},
                    max_pods=10**6,  # the trace simulator does not cap pods per node
                )
            )
            seen.add(name)
        except TraceError:
            if not skip_bad_rows:
                raise
    if not nodes:
        raise TraceError(p, 1, "rows", "no nodes in the node list")
    return nodes


def bundled(name: str) -> Path:
    """Path of a file shipped inside the package (``openb_pod_list_default.csv`` ...)."""
    return Path(str(resources.files("gpufleet") / "data" / "alibaba-gpu-v2023" / name))


DEFAULT_PODS = "openb_pod_list_default.csv"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
