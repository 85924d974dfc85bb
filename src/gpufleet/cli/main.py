"""``gpufleet`` command: one sub-command per part.

The CLI only parses arguments and wires adapters together; each sub-command's
work lives in its own package.  Sub-commands whose package is not installed or
not built yet say so clearly instead of failing with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# sub-command -> module with add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("gpufleet.cli.simulate", "replay a cluster trace through the scheduling engine (the main job)"),
    "scheduler": ("gpufleet.kube.cli", "run the secondary scheduler against a Kubernetes cluster"),
    "extender": ("gpufleet.kube.extender_cli", "run the kube-scheduler extender HTTP server"),
    "explain": ("gpufleet.kube.explain_cli", "explain why a pod is pending, node by node"),
    "agent": ("gpufleet.agent.main", "run the node agent (device plugin, labels, metrics, health)"),
    "reclaim": ("gpufleet.utilization.reclaim_cli", "find idle GPUs and reclaim them under a policy"),
    "recommend": ("gpufleet.utilization.recommend_cli", "recommend right-sized GPU requests per workload"),
    "top": ("gpufleet.utilization.top_cli", "terminal view of GPU allocation and utilisation"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="gpufleet", description="GPU scheduling and resource management for Kubernetes")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logging (every command logs at INFO by default; a command's own --log-level wins)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, (modname, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)  # type: ignore[attr-defined]
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


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
