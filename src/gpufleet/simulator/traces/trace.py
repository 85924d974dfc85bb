"""Reading Alibaba ``openb`` traces (node lists and pod lists).

Pod lists come in an 11-column form (``name,cpu_milli,memory_mib,num_gpu,
gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``)
and a 5-column form (the first five).  Node lists are ``sn,cpu_milli,
memory_mib,gpu,model``.  A broken row is an error naming the file, the line
and the field, unless the caller asks to skip bad rows, in which case they are
counted and reported: nothing silently changes the experiment.  Files are
UTF-8 (a byte-order mark, as spreadsheets write, is accepted); numbers must be
finite integers within a per-column range, so a ``nan``, ``inf`` or ``1e40``
is a bad row, not a silently different cluster.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ...engine.errors import GpufleetError
from ...engine.gpu_models import lookup, mig_profile_memory_mib
from ...engine.model import GPU_MILLI, Gpu, Node, PodRequest

POD_COLUMNS_FULL = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)
POD_COLUMNS_SHORT = POD_COLUMNS_FULL[:5]
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
MAX_GPUS_PER_NODE = 16
_T = TypeVar("_T")
# Largest value a column may hold: far above any real machine, far below where int64 arithmetic breaks.
COLUMN_MAX = {
    "cpu_milli": 10**9,  # a million cores
    "memory_mib": 2**40,  # an exbibyte
    "num_gpu": 1024,
    "gpu_milli": GPU_MILLI,
    "gpu": MAX_GPUS_PER_NODE,
    "creation_time": 2**53,
    "deletion_time": 2**53,
    "scheduled_time": 2**53,
}


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
    mig_profile: str = ""  # one MIG instance of this profile (``nvidia.com/mig-<profile>: 1``) instead of a share

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU, as ``request().total_gpu_milli`` (without building the request)."""
        return 0 if self.num_gpu == 0 else self.gpu_milli if self.num_gpu == 1 else self.num_gpu * GPU_MILLI

    def request(self, name: str | None = None) -> PodRequest:
        """The engine request: num_gpu whole GPUs, or one GPU share when gpu_milli < 1000."""
        if self.mig_profile:  # as parse_pod models nvidia.com/mig-<profile>: 1
            return PodRequest(name=name or self.name, namespace="trace", cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
                              gpu_count=1, gpu_milli=0, gpu_memory_mib=mig_profile_memory_mib(self.mig_profile) or 0,
                              mig_profile=self.mig_profile,
                              gpu_models_allow=frozenset(self.gpu_spec) if self.gpu_spec else None)
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


@dataclass
class NodeList:
    nodes: list[Node]
    skipped_rows: list[str] = field(default_factory=list)


def _int(path: str, line: int, col: str, raw: str, minimum: int = 0, optional: bool = False) -> int | None:
    raw = (raw or "").strip()
    if raw == "" and optional:
        return None
    shown = raw if len(raw) <= 24 else raw[:21] + "..."
    try:
        v = int(raw)
    except ValueError:
        try:
            f = float(raw)
        except ValueError:
            raise TraceError(path, line, col, f"expected an integer, got {shown!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise TraceError(path, line, col, f"expected a finite integer, got {shown!r}") from None
        v = int(f)
    hi = COLUMN_MAX.get(col)
    if v < minimum or (hi is not None and v > hi):
        raise TraceError(path, line, col, f"must be in [{minimum}, {hi if hi is not None else 'inf'}], got {shown}")
    return v


def _decode(path: Path) -> str:
    """The file's text; a byte that is not UTF-8 is an error naming its line and column (a leading BOM is dropped)."""
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        header = data[: data.find(b"\n")].decode("utf-8", "replace").split(",") if line > 1 else []
        col = data.count(b",", start, exc.start)
        field = header[col].strip() if col < len(header) else f"column {col + 1}"
        raise TraceError(str(path), line, field or "encoding",
                         f"byte 0x{data[exc.start]:02x} is not UTF-8 (save the file as UTF-8)") from None


def _rows(path: Path, reader: Iterator[list[str]]) -> Iterator[tuple[int, list[str]]]:
    """(line number, row) pairs; a row the csv module cannot read (a NUL byte ...) is an error naming its line."""
    r = reader
    while True:
        try:
            row = next(r)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(str(path), getattr(reader, "line_num", 0), "row", str(exc)) from None
        yield getattr(reader, "line_num", 0), row


def _header_problem(header: list[str], expected: tuple[tuple[str, ...], ...]) -> str:
    """A short message pointing at the first wrong column of the closest expected header."""
    best = min(expected, key=lambda e: (abs(len(e) - len(header)), -sum(a == b for a, b in zip(header, e))))
    form = ",".join(best)
    for i, (got, want) in enumerate(zip(header, best), start=1):
        if got != want:
            return f"column {i} is {got[:40]!r}, expected {want!r} (header: {form})"
    if len(header) < len(best):
        return f"missing column {len(header) + 1} {best[len(header)]!r} (header: {form})"
    return f"unexpected column {len(best) + 1} {header[len(best)][:40]!r} (header: {form})"


def _open_rows(path: Path, expected: tuple[tuple[str, ...], ...]) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(_decode(path), newline=""))
    rows = _rows(path, reader)
    first = next(rows, None)
    if first is None:
        raise TraceError(str(path), 1, "header", "file is empty")
    header = [h.strip() for h in first[1]]
    if tuple(header) not in expected:
        raise TraceError(str(path), 1, "header", _header_problem(header, expected))
    return header, rows


def parse_rows(path: Path, expected: tuple[tuple[str, ...], ...], key: str, what: str, skip_bad_rows: bool,
                parse: Callable[[str, int, dict[str, str], str], _T]) -> tuple[list[_T], list[str]]:
    """Every non-blank row of a CSV through ``parse(path, line, row, name)``; ``key`` names the column that
    must be set and unique (a ``what`` name).  With ``skip_bad_rows`` a bad row is kept as its error line."""
    header, reader = _open_rows(path, expected)
    out: list[_T] = []
    skipped: list[str] = []
    seen: set[str] = set()
    p = str(path)
    for lineno, row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        try:
            if len(row) != len(header):
                raise TraceError(p, lineno, "row", f"expected {len(header)} columns, got {len(row)}")
            d = dict(zip(header, row))
            name = d[key].strip()
            if not name:
                raise TraceError(p, lineno, key, "empty")
            if name in seen:
                raise TraceError(p, lineno, key, f"duplicate {what} name {name!r}")
            out.append(parse(p, lineno, d, name))
            seen.add(name)
        except TraceError as exc:
            if not skip_bad_rows:
                raise
            skipped.append(str(exc))
    return out, skipped


def _pod_row(p: str, lineno: int, d: dict[str, str], name: str) -> TracePod:
    num_gpu = _int(p, lineno, "num_gpu", d["num_gpu"])
    gpu_milli = _int(p, lineno, "gpu_milli", d["gpu_milli"])
    assert num_gpu is not None and gpu_milli is not None
    if num_gpu > 1 and gpu_milli != GPU_MILLI:
        raise TraceError(p, lineno, "gpu_milli", f"a pod with num_gpu {num_gpu} takes whole GPUs: gpu_milli must be "
                                                 f"{GPU_MILLI}, got {gpu_milli}")
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
    return TracePod(
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


def load_pods(path: str | Path, skip_bad_rows: bool = False) -> Trace:
    path = Path(path)
    pods, skipped = parse_rows(path, (POD_COLUMNS_FULL, POD_COLUMNS_SHORT), "name", "pod", skip_bad_rows, _pod_row)
    return Trace(name=path.stem, pods=pods, skipped_rows=skipped)


def _node_row(p: str, lineno: int, d: dict[str, str], name: str) -> Node:
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
    return Node(
        name=name,
        cpu_milli=_int(p, lineno, "cpu_milli", d["cpu_milli"], minimum=1),  # type: ignore[arg-type]
        memory_mib=_int(p, lineno, "memory_mib", d["memory_mib"], minimum=1),  # type: ignore[arg-type]
        gpus=gpus,
        labels={"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": model} if ngpu else {})},
        max_pods=10**6,  # the trace simulator does not cap pods per node
    )


def read_nodes(path: str | Path, skip_bad_rows: bool = False) -> NodeList:
    path = Path(path)
    p = str(path)
    nodes, skipped = parse_rows(path, (NODE_COLUMNS,), "sn", "node", skip_bad_rows, _node_row)
    if not nodes:
        raise TraceError(p, 1, "rows", "no nodes in the node list" + (f" ({len(skipped)} bad row(s) skipped)" if skipped else ""))
    if not any(n.gpus for n in nodes):
        raise TraceError(p, 1, "gpu", f"none of the {len(nodes)} nodes has a GPU: nothing to schedule GPU pods on")
    return NodeList(nodes, skipped)


def load_nodes(path: str | Path, skip_bad_rows: bool = False) -> list[Node]:
    """The nodes of a node list (``read_nodes`` also gives the skipped rows)."""
    return read_nodes(path, skip_bad_rows).nodes


def unplaceable(pods: list[TracePod], nodes: list[Node]) -> dict[str, str]:
    """Pods that no node of this cluster could hold even when empty, with the reason: pod name -> reason.

    They can never be placed by any policy, so the simulator leaves them out of
    the runs and says so, instead of counting them as every policy's failure.
    """
    groups = {(n.gpus[0].model if n.gpus else "", len(n.gpus), n.cpu_milli, n.memory_mib) for n in nodes}
    max_gpus = max(g[1] for g in groups)
    out: dict[str, str] = {}
    cache: dict[tuple[int, int, int, tuple[str, ...]], str] = {}
    for p in pods:
        key = (p.num_gpu, p.cpu_milli, p.memory_mib, p.gpu_spec)
        if key not in cache:
            fit = [g for g in groups if g[1] >= p.num_gpu]
            reason = ""
            if not fit:
                reason = f"needs {p.num_gpu} GPUs; the largest node has {max_gpus}"
            elif p.num_gpu and p.gpu_spec:
                fit = [g for g in fit if g[0] in p.gpu_spec]
                if not fit:
                    reason = f"needs GPU model {'|'.join(p.gpu_spec)}; no node with {p.num_gpu} GPU(s) has it"
            if not reason:
                fit = [g for g in fit if g[2] >= p.cpu_milli]
                if not fit:
                    reason = f"needs cpu_milli {p.cpu_milli}; no node that could hold its GPUs has that much"
            if not reason and not [g for g in fit if g[3] >= p.memory_mib]:
                reason = f"needs memory_mib {p.memory_mib}; no node that could hold its GPUs and CPU has that much"
            cache[key] = reason
        if cache[key]:
            out[p.name] = cache[key]
    return out


def bundled(name: str) -> Path:
    """Path of a file shipped inside the package (``openb_pod_list_default.csv`` ...)."""
    return Path(str(resources.files("gpufleet") / "data" / "alibaba-gpu-v2023" / name))


DEFAULT_PODS = "openb_pod_list_default.csv"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
