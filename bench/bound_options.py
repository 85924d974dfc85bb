"""The offline bound's MIP under other HiGHS options, seed by seed: CPU seconds and whether it prints the same.

Why: the main job's MIP (``bounds/bound.py``) is a quarter of its CPU, and HiGHS's work is deterministic for one
program and one set of options, so an option that saves time takes another path, whose best placement (its %,
the gap, the pods it leaves out) may differ even where the bound does not.  This script answers "same output,
and how much faster, on which seeds" for a list of option sets: for every seed it solves the bound with
HiGHS's defaults and then with each ``--variant`` (one process, one after another), and prints each solve's CPU
seconds and, for a variant, ``same`` or the fields of ``BoundResult.to_json()`` that differ (less ``solve_s``).

    PYTHONPATH=src python bench/bound_options.py --seeds 42-51 --variant mip_heuristic_run_rins=false \\
        --variant mip_rel_gap=0.0015 --variant threads=1,mip_detect_symmetry=false

Values: ``true``/``false``, integers, decimals, or text (HiGHS's own option names and types).
"""

from __future__ import annotations

import sys
import time
from typing import Any


def parse_variant(text: str) -> dict[str, bool | int | float | str]:
    """``name=value,name=value`` as HiGHS option values."""
    out: dict[str, bool | int | float | str] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        if not sep or not name.strip() or not raw.strip():
            raise ValueError(f"--variant: expected name=value, got {part!r}")
        raw = raw.strip()
        value: bool | int | float | str
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[name.strip()] = value
    return out


def differences(base: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields of two ``BoundResult.to_json()`` that differ, less the solve's time."""
    return {k: (base.get(k), other.get(k)) for k in sorted(set(base) | set(other))
            if k != "solve_s" and base.get(k) != other.get(k)}


def main() -> int:
    from highspy import _core as h

    from gpufleet.cli import simulate
    from gpufleet.cli.main import Parser
    from gpufleet.simulator.bounds import bound
    from gpufleet.simulator.traces import trace as tracemod

    ap = Parser(prog="bound_options.py", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=simulate.parse_seeds, default=[42], help="seeds: 42, 42-51 or 1,2,3 (default 42)")
    ap.add_argument("--variant", action="append", default=[], type=parse_variant,
                    help="HiGHS options name=value[,name=value...]; repeat for several variants")
    args = ap.parse_args()
    current: dict[str, bool | int | float | str] = {}

    class Highs(h._Highs):
        def passOptions(self, options: Any) -> Any:
            status = super().passOptions(options)
            for name, value in current.items():
                if self.setOptionValue(name, value) != h.HighsStatus.kOk:
                    raise ValueError(f"--variant: HiGHS does not take {name}={value!r}")
            return status

    h._Highs = Highs  # bounds/bound.py looks it up at each solve
    nl, _read, tr, _bad = simulate._load_all(str(tracemod.bundled(tracemod.DEFAULT_NODES)),
                                            str(tracemod.bundled(tracemod.DEFAULT_PODS)), False)
    variants: list[dict[str, bool | int | float | str]] = [{}, *args.variant]
    total = [0.0] * len(variants)
    same = [0] * len(variants)
    for seed in args.seeds:
        base: dict[str, Any] = {}
        for n, v in enumerate(variants):
            current.clear()
            current.update(v)
            cpu = time.process_time()
            got = bound.offline_bound(nl.nodes, tr.pods, seed=seed, tune=1.3).to_json()
            cpu = time.process_time() - cpu
            total[n] += cpu
            name = ",".join(f"{k}={x}" for k, x in v.items()) or "HiGHS's defaults"
            if not v:
                base = got
                print(f"seed {seed} {name}: {cpu:.2f} CPU s; bound {got['unallocated_gpu_pct']}%, best found "
                      f"{got['best_found_pct']}%, gap {got['gap_pct']}, left out {got['left_out']}")
                continue
            diff = differences(base, got)
            same[n] += not diff
            print(f"seed {seed} {name}: {cpu:.2f} CPU s; " + ("same" if not diff else f"differs: {diff}"))
    for n, v in enumerate(variants):
        name = ",".join(f"{k}={x}" for k, x in v.items()) or "HiGHS's defaults"
        tail = "" if not v else f"; the same output in {same[n]} of {len(args.seeds)} seeds"
        print(f"all seeds, {name}: {total[n]:.2f} CPU s{tail}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bound_options.py", main))
