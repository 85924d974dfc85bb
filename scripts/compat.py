#!/usr/bin/env python3
"""Run the real-component tiers on a Kubernetes release and render the compatibility table from what they printed.

The table in docs/compatibility.md says which releases gpufleet is proven on; a hand-written table goes stale the day
a tier changes, so it is generated here from the runs' own JUnit reports, and each run's record (counts, wall time,
the versions the binaries themselves report, the commit under test) is kept beside it in docs/compat/.

    python3 scripts/compat.py run --release 1.37.2 [--tier apiserver,node,extender,image,prometheus]
    python3 scripts/compat.py table            # rewrites docs/compatibility.md from docs/compat/*.json

``run`` builds what the tiers need with scripts/build-k8s.sh (nothing when the cache is complete), then runs each
tier as its own pytest session. The node tiers need root and take the real-node lock (GPUFLEET_E2E_LOCK, default
/tmp/gpufleet-realnode.lock) while their node is up.

A test the release cannot run (``min_release``: the feature is not served there) is deselected, not skipped, so the
JUnit report never names it; this script loads itself as a pytest plugin (``-p compat``) to record each deselected
test with its marker's reason, and the table lists them beside the skips and the failures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "compat"
TABLE = REPO / "docs" / "compatibility.md"

# tier -> (what it proves, pytest paths, components it needs from the build, needs root)
TIERS: dict[str, tuple[str, list[str], list[str], bool]] = {
    "apiserver": ("gpufleet's scheduler, extender, explain, queues and gangs on a real kube-apiserver + etcd, "
                  "side by side with the real kube-scheduler", ["tests", "-m", "apiserver"], ["control-plane"], False),
    "node": ("agent (device plugin, DRA driver, GFD labels, metrics, health), scheduler and autoscaling on a real "
             "kubelet + containerd v2 (CDI)", ["tests/e2e", "--ignore=tests/e2e/test_extender_node.py"], [], True),
    "extender": ("gpufleet as an extender of the real kube-scheduler, with a real kubelet and Prometheus",
                 ["tests/e2e/test_extender_node.py"], [], True),
    "image": ("the container image deployed by the project's own manifests (kubectl apply -k) on a real node",
              ["tests/deploy/test_deploy_image.py"], [], True),
    "prometheus": ("recording and alert rules under the real promtool", ["tests/deploy/monitoring"], [], False),
}


def _die(msg: str, code: int = 2) -> None:
    print(f"compat.py: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _version(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""


def _junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in c:
            c[k] += int(s.get(k, 0))
    return {"passed": c["tests"] - c["failures"] - c["errors"] - c["skipped"], "failed": c["failures"] + c["errors"],
            "skipped": c["skipped"]}


def _skip_reasons(path: Path) -> list[str]:
    reasons = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        sk = tc.find("skipped")
        if sk is not None:
            reasons.append(f"{tc.get('name')}: {(sk.get('message') or '').strip()[:160]}")
    return reasons


def _failures(path: Path) -> list[str]:
    out = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        bad = tc.find("failure")
        if bad is None:
            bad = tc.find("error")
        if bad is not None:
            msg = (bad.get("message") or "").strip().splitlines()
            out.append(f"{tc.get('classname')}::{tc.get('name')}: {(msg[0] if msg else '')[:200]}")
    return out


DESELECTED_ENV = "GPUFLEET_COMPAT_DESELECTED"


def pytest_deselected(items: list) -> None:  # pytest hook: this module is loaded into each tier's run with -p compat
    out = os.environ.get(DESELECTED_ENV)
    if not out:
        return
    with open(out, "a") as f:
        for item in items:
            m = item.get_closest_marker("min_release")
            why = ""
            if m is not None:
                why = m.kwargs.get("reason") or f"needs Kubernetes {'.'.join(str(a) for a in m.args)} or later"
            f.write(json.dumps({"test": item.nodeid, "reason": why}) + "\n")


def _deselected(path: Path) -> list[str]:
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [f"{r['test']}: {r['reason'] or 'deselected'}" for r in recs]


# what a run writes into the checkout itself: not a change to the code under test
_OWN_OUTPUT = ("docs/compat/*", "docs/compatibility.md")


def _dirty(repo: Path) -> bool:
    st = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                        capture_output=True, text=True, check=False).stdout
    changed = [line[3:].strip() for line in st.splitlines() if line.strip()]
    return any(not any(fnmatch.fnmatch(c, pat) for pat in _OWN_OUTPUT) for c in changed)


def cmd_run(args: argparse.Namespace) -> int:
    tiers = [t.strip() for t in args.tier.split(",") if t.strip()]
    if args.image_tar and not Path(args.image_tar).is_file():
        _die(f"--image-tar: {args.image_tar} is not a file")
    for t in tiers:
        if t not in TIERS:
            _die(f"--tier: unknown tier '{t}' (one of {', '.join(TIERS)})")
    if any(TIERS[t][3] for t in tiers) and os.geteuid() != 0:
        _die(f"--tier: {', '.join(t for t in tiers if TIERS[t][3])} need(s) root (a real kubelet and containerd)")
    build = ["bash", str(REPO / "scripts" / "build-k8s.sh"), "--print-dir", args.release]
    if not any(TIERS[t][3] for t in tiers):
        build.append("control-plane")  # a node tier needs every binary; the others the control plane alone
    r = subprocess.run(build, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        return r.returncode
    bindir = Path(r.stdout.strip())
    versions = {b: _version(bindir / b) for b in ("kube-apiserver", "kube-scheduler", "kubelet", "kube-controller-manager",
                                                  "containerd") if (bindir / b).exists()}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    dirty = _dirty(REPO)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rc = 0
    for t in tiers:
        what, paths, _, root = TIERS[t]
        xml = RESULTS / f".{t}-{args.release}.xml"
        desel = RESULTS / f".{t}-{args.release}.deselected"
        desel.unlink(missing_ok=True)
        env = dict(os.environ, KUBEBUILDER_ASSETS=str(bindir), KUBECTL=str(bindir / "kubectl"),
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "scripts")]),
                   **{DESELECTED_ENV: str(desel)})
        if args.image_tar:
            env["GPUFLEET_E2E_IMAGE_TAR"] = args.image_tar
        if root:
            env["GPUFLEET_E2E_BIN"] = str(bindir)
            env.setdefault("GPUFLEET_E2E_LOCK", "/tmp/gpufleet-realnode.lock")
        t0 = time.monotonic()
        print(f"compat.py: {t} on v{args.release}: pytest {' '.join(paths)}", flush=True)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "compat",
                            f"--junitxml={xml}", *paths],
                           cwd=REPO, env=env, check=False)
        wall_s = time.monotonic() - t0
        if not xml.exists():
            print(f"compat.py: {t}: pytest wrote no report (exit {p.returncode})", file=sys.stderr)
            rc = 1
            continue
        rec = {"release": args.release, "tier": t, "what": what, "paths": paths, **_junit_counts(xml),
               "deselected": len(_deselected(desel)), "skip_reasons": _skip_reasons(xml),
               "deselect_reasons": _deselected(desel), "failures": _failures(xml),
               "wall_s": round(wall_s, 1), "exit": p.returncode,
               "versions": versions, "commit": commit + ("-dirty" if dirty else ""),
               "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}
        xml.unlink()
        desel.unlink(missing_ok=True)
        (RESULTS / f"{t}-{args.release}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"compat.py: {t} on v{args.release}: {rec['passed']} passed, {rec['failed']} failed, "
              f"{rec['skipped']} skipped, {rec['deselected']} deselected in {rec['wall_s']} s", flush=True)
        rc = rc or (1 if p.returncode not in (0, 5) else 0)
    if not args.no_table:
        render()
    return rc


def _release_key(r: str) -> tuple[int, ...]:
    return tuple(int(x) for x in r.split("."))


def _verdict(r: dict) -> str:
    if r["failed"]:
        return "**FAIL**"
    return "**pass**" if r["passed"] > 0 else "skipped"


def render(results: Path = RESULTS, table: Path = TABLE) -> None:
    recs = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    releases = sorted({r["release"] for r in recs}, key=_release_key, reverse=True)
    by = {(r["tier"], r["release"]): r for r in recs}
    lines = ["# Compatibility", "",
             "Generated by `python3 scripts/compat.py table` from the runs recorded in `docs/compat/` (each made by",
             "`sudo python3 scripts/compat.py run --release R`, which builds release R with `scripts/build-k8s.sh` and",
             "runs every real-component tier on it). Do not edit by hand: rerun the tiers.", "",
             "Each cell: the verdict; tests passed, failed, skipped and deselected (a test that needs a newer release",
             "than the one run, listed below with its reason); the tier's wall time; the date and the commit under test",
             "(`-dirty`: with uncommitted changes).", "",
             "| tier | what it proves | " + " | ".join(f"v{r}" for r in releases) + " |",
             "|---|---|" + "---|" * len(releases)]
    for t, (what, *_rest) in TIERS.items():
        cells = []
        for rel in releases:
            r = by.get((t, rel))
            if r is None:
                cells.append("not run")
                continue
            cells.append(f"{_verdict(r)}: {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped, "
                         f"{r.get('deselected', 0)} deselected; {r['wall_s']:.0f} s ({r['date']}, {r['commit']})")
        lines.append(f"| {t} | {what} | " + " | ".join(cells) + " |")
    complete = [rel for rel in releases if all((t, rel) in by and _verdict(by[(t, rel)]) == "**pass**" for t in TIERS)]
    lines += ["", "## Where the floor is", ""]
    if complete:
        lines.append(f"- Every tier passes on: {', '.join(f'v{r}' for r in complete)}. The oldest of them, "
                     f"**v{complete[-1]}**, is the floor these runs prove.")
    else:
        lines.append("- No release has every tier passing yet.")
    partial = [rel for rel in releases if rel not in complete]
    if partial:
        lines.append(f"- Not every tier passes (or was run) on: {', '.join(f'v{r}' for r in partial)}; see the "
                     "failures below.")
    lines.append("- **1.28** (the release gpufleet was first proven on) is not run: the Go module proxy serves "
                 "`k8s.io/kubernetes` no older than 1.34, so `scripts/build-k8s.sh` cannot build it, and the tiers "
                 "accept only the recipe's binaries. The device-plugin path uses only APIs 1.28 had, but nothing "
                 "here proves it (docs/real-components.md, \"Where the floor is\").")
    lines += ["", "## Versions the binaries reported", ""]
    for rel in releases:
        vs: dict[str, str] = next((r["versions"] for r in recs if r["release"] == rel and r["versions"]), {})
        lines.append(f"- v{rel}: " + ", ".join(f"{k} `{v}`" for k, v in sorted(vs.items())))
    for title, key in (("Failed tests", "failures"), ("Deselected tests and why", "deselect_reasons"),
                       ("Skipped tests and why", "skip_reasons")):
        rows = [(r["tier"], r["release"], s) for r in recs for s in r.get(key, [])]
        if rows:
            lines += ["", f"## {title}", ""]
            lines += [f"- {t} v{rel}: {s}" for t, rel, s in sorted(rows, key=lambda x: (x[0], _release_key(x[1]), x[2]))]
    table.write_text("\n".join(lines) + "\n")
    print(f"compat.py: wrote {table} ({len(recs)} runs, releases {', '.join(releases)})")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="compat.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run tiers on one release and record them")
    r.add_argument("--release", default="1.37.2")
    r.add_argument("--tier", default=",".join(TIERS))
    r.add_argument("--image-tar", default=os.environ.get("GPUFLEET_E2E_IMAGE_TAR", ""),
                   help="the image as a docker-archive for the image tier (scripts/build-image.sh --save FILE)")
    r.add_argument("--no-table", action="store_true", help="record only; do not rewrite docs/compatibility.md")
    sub.add_parser("table", help="rewrite docs/compatibility.md from docs/compat/*.json")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    render()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
