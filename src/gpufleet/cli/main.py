"""``gpufleet`` command: one sub-command per part.

The CLI only parses arguments and wires adapters together; each sub-command's
work lives in its own package.  Sub-commands whose package is not installed or
not built yet say so clearly instead of failing with a traceback.

One error discipline for every sub-command: bad usage or input exits 2, a
runtime failure (cluster or Prometheus unreachable, an API error) exits 1,
each with one line on stderr naming the flag, the file:line and field, or the
object; a traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# sub-command -> module with add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("gpufleet.cli.simulate", "replay a cluster trace through the scheduling engine (the main job)"),
    "scheduler": ("gpufleet.kube.cli", "run the secondary scheduler against a Kubernetes cluster"),
    "extender": ("gpufleet.kube.extender_cli", "run the kube-scheduler extender HTTP server"),
    "explain": ("gpufleet.kube.explain_cli", "explain why a pod is pending, node by node"),
    "agent": ("gpufleet.agent.main", "run the node agent (device plugin, labels, metrics, health)"),
    "agent-endpoint": ("gpufleet.agent.endpoint", "the node agent's device-plugin endpoint for kubelet, kept up across agent restarts"),
    "reclaim": ("gpufleet.utilization.reclaim_cli", "find idle GPUs and reclaim them under a policy"),
    "recommend": ("gpufleet.utilization.recommend_cli", "recommend right-sized GPU requests per workload"),
    "top": ("gpufleet.utilization.top_cli", "terminal view of GPU allocation and utilisation"),
    "explain-hpa": ("gpufleet.utilization.hpa_cli", "explain why an autoscaler on GPU metrics does or does not scale"),
    "cost": ("gpufleet.utilization.cost_cli", "GPU-hours and cost per namespace, team queue and workload"),
}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the usage block; sub-parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, but an unknown flag is reported by the sub-command it was given to, with its help."""
        argv = list(sys.argv[1:] if args is None else args)
        ns, extra = self.parse_known_args(argv, namespace)
        if extra:
            self._chosen(ns, argv, argv.index(extra[0]) if extra[0] in argv else len(argv)).error(
                f"unrecognized arguments: {' '.join(extra)}")
        return ns

    def _chosen(self, ns: argparse.Namespace, argv: list[str], at: int) -> argparse.ArgumentParser:
        """The innermost (sub-)parser whose command name comes before position ``at`` of the command line."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(ns, action.dest, None) or ""
                sub = action.choices.get(name)
                if sub is not None and name in argv[:at]:
                    return sub._chosen(ns, argv, at) if isinstance(sub, Parser) else sub
        return self


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """The parser of every command; ``only``: import and build the full sub-parser of that command alone (the
    others are listed by name: importing every command's package costs about 0.1 s of start-up)."""
    from ..version import version_string

    parser = Parser(prog="gpufleet", description="GPU scheduling and resource management for Kubernetes")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logging (every command logs at INFO by default; a command's own --log-level wins)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (default: one line)")
    parser.add_argument("--version", action="version", version=version_string(), help="print the version (and git commit) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="one of:")
    modules: dict[str, object] = {}
    for name, (modname, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        modules[name] = mod
    return parser, modules


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(verbose: int, explicit: str | None) -> int:
    """INFO by default, DEBUG with ``-v``; a sub-command's own ``--log-level`` wins. Raises ValueError."""
    if explicit:
        name = str(explicit).strip().upper()
        if name not in LOG_LEVELS:
            raise ValueError(f"--log-level: must be one of {', '.join(LOG_LEVELS)} (any case), got {explicit!r}")
        return int(getattr(logging, name))
    return logging.DEBUG if verbose > 0 else logging.INFO


def configure_logging(level: int) -> None:
    """One root configuration for every command (``force``: replaces whatever was set before, so nothing
    later can silently keep the wrong level)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, force=True)


def _command_in(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line: the first word that is not a flag (the top-level flags take
    no value); None when there is none or it is not a command (the full parser then says so)."""
    for a in argv:
        if not a.startswith("-"):
            return a if a in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the command named in ``argv``; its exit status.  ``argv`` None: this process's own command line (the
    ``gpufleet`` script, ``python -m gpufleet``), and the process ends when this returns (``_ending``)."""
    code = _main(argv)
    if argv is None:
        _ending()
    return code


def _ending() -> None:
    """The process ends next: keep the cyclic garbage collector from going over every live object on the way out.

    Why: at exit CPython clears the modules and runs the collector over whatever is still alive, pass after pass.
    After ``gpufleet simulate`` (the trace, the runs' shared inputs and results: about 100,000 objects) that took
    0.2 to 0.3 s of wall clock after the last output was written, longer than the table, the JSON and the report took.
    ``gc.freeze()`` moves the live objects out of the collector's sight: they are still freed by reference counting
    as the modules go, only cycles among them are left to the operating system, which takes back the whole
    process's memory anyway (Python never promised ``__del__`` at exit).  Outputs are written and closed by then,
    ``atexit`` handlers and the standard streams' flush run as before.  Not for ``main(argv)`` called in a process
    that goes on (tests, scripts)."""
    import gc

    gc.freeze()


def _main(argv: list[str] | None) -> int:
    parser, modules = build_parser(_command_in(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    try:
        level = log_level(args.verbose, getattr(args, "log_level", None))
    except ValueError as exc:
        print(f"gpufleet {args.command}: {exc}", file=sys.stderr)
        return 2
    configure_logging(level)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place an error becomes an exit status and one line
        if args.debug:
            raise
        code, text = describe_error(exc)
        print(f"gpufleet {args.command}: {text}", file=sys.stderr)
        return code


def run_script(prog: str, main: Callable[[], int | None]) -> int:
    """A script's ``main`` (``bench/``) under the commands' contract: an error is one line on stderr and exit 2
    (bad input) or 1 (a failure); ``GPUFLEET_DEBUG=1`` shows the traceback instead."""
    try:
        return int(main() or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("GPUFLEET_DEBUG"):
            raise
        code, text = describe_error(exc, debug_hint="GPUFLEET_DEBUG=1 shows the traceback")
        print(f"{prog}: {text}", file=sys.stderr)
        return code


def describe_error(exc: BaseException, debug_hint: str = "run with --debug for the traceback") -> tuple[int, str]:
    """(exit status, one line) for an error that reached the top of a command."""
    from ..engine.errors import GpufleetError

    if isinstance(exc, GpufleetError):
        return exc.exit_code, _one_line(str(exc))
    name = type(exc).__name__
    try:  # a lost or refused connection to the API server, or an API error reply
        import urllib3.exceptions
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException):
            return 1, _one_line(f"Kubernetes API error {exc.status} {exc.reason}")
        if isinstance(exc, urllib3.exceptions.MaxRetryError):
            return 1, _one_line(f"cannot reach the Kubernetes API server ({exc.pool.host}:{exc.pool.port}): {_reason(exc.reason)}")
        if isinstance(exc, urllib3.exceptions.HTTPError):
            conn = getattr(exc, "conn", None)
            where = f" ({conn.host}:{conn.port})" if conn is not None and hasattr(conn, "host") else ""
            return 1, _one_line(f"cannot reach the Kubernetes API server{where}: {_reason(exc)}")
    except ImportError:  # pragma: no cover - kubernetes is a dependency
        pass
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return 1, _one_line(f"{exc.strerror or name}{':' + where if where else ''}")
    return 1, _one_line(f"internal error: {name}: {exc} ({debug_hint})")


def _reason(exc: object) -> str:
    text = str(exc)
    return text.rsplit(": ", 1)[-1].rstrip("')\"") if "Errno" in text or "Failed" in text else text


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
