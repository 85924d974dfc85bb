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
"""

from __future__ import annotations

import argparse
import datetime as dt
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
                  "side by side with the real kube-scheduler", ["tests/integration"], ["control-plane"], False),
    "node": ("agent (device plugin, DRA driver, GFD labels, metrics, health), scheduler and autoscaling on a real "
             "kubelet + containerd v2 (CDI)", ["tests/e2e", "--ignore=tests/e2e/test_extender_node.py"], [], True),
    "extender": ("gpufleet as an extender of the real kube-scheduler, with a real kubelet and Prometheus",
                 ["tests/e2e/test_extender_node.py"], [], True),
    "image": ("the container image deployed by the project's own manifests (kubectl apply -k) on a real node",
              ["tests/deploy/test_deploy_image.py"], [], True),
    "prometheus": ("recording and alert rules under the real promtool", ["tests/monitoring"], [], False),
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
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=False).stdout.strip())
    RESULTS.mkdir(parents=True, exist_ok=True)
    rc = 0
    for t in tiers:
        what, paths, _, root = TIERS[t]
        env = dict(os.environ, KUBEBUILDER_ASSETS=str(bindir), KUBECTL=str(bindir / "kubectl"), PYTHONPATH=str(REPO / "src"))
        if args.image_tar:
            env["GPUFLEET_E2E_IMAGE_TAR"] = args.image_tar
        if root:
            env["GPUFLEET_E2E_BIN"] = str(bindir)
            env.setdefault("GPUFLEET_E2E_LOCK", "/tmp/gpufleet-realnode.lock")
        xml = RESULTS / f".{t}-{args.release}.xml"
        t0 = time.monotonic()
        print(f"compat.py: {t} on v{args.release}: pytest {' '.join(paths)}", flush=True)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths],
                           cwd=REPO, env=env, check=False)
        wall_s = time.monotonic() - t0
        if not xml.exists():
            print(f"compat.py: {t}: pytest wrote no report (exit {p.returncode})", file=sys.stderr)
            rc = 1
            continue
        rec = {"release": args.release, "tier": t, "what": what, "paths": paths, **_junit_counts(xml),
               "skip_reasons": _skip_reasons(xml), "wall_s": round(wall_s, 1), "exit": p.returncode,
               "versions": versions, "commit": commit + ("-dirty" if dirty else ""),
               "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}
        xml.unlink()
        (RESULTS / f"{t}-{args.release}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"compat.py: {t} on v{args.release}: {rec['passed']} passed, {rec['failed']} failed, "
              f"{rec['skipped']} skipped in {rec['wall_s']} s", flush=True)
        rc = rc or (1 if p.returncode not in (0, 5) else 0)
    if not args.no_table:
        render()
    return rc


def _release_key(r: str) -> tuple[int, ...]:
    return tuple(int(x) for x in r.split("."))


def render() -> None:
    recs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    releases = sorted({r["release"] for r in recs}, key=_release_key, reverse=True)
    by = {(r["tier"], r["release"]): r for r in recs}
    lines = ["# Compatibility", "",
             "Generated by `python3 scripts/compat.py table` from the runs recorded in `docs/compat/` (each made by",
             "`sudo python3 scripts/compat.py run --release R`, which builds release R with `scripts/build-k8s.sh` and",
             "runs every real-component tier on it). Do not edit by hand: rerun the tiers.", "",
             "| tier | what it proves | " + " | ".join(f"v{r}" for r in releases) + " |",
             "|---|---|" + "---|" * len(releases)]
    for t, (what, *_rest) in TIERS.items():
        cells = []
        for rel in releases:
            r = by.get((t, rel))
            if r is None:
                cells.append("not run")
                continue
            verdict = "**pass**" if r["failed"] == 0 and r["passed"] > 0 else ("**FAIL**" if r["failed"] else "skipped")
            cells.append(f"{verdict}: {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped, "
                         f"{r['wall_s']:.0f} s ({r['date']}, {r['commit']})")
        lines.append(f"| {t} | {what} | " + " | ".join(cells) + " |")
    lines += ["", "Versions the binaries reported:", ""]
    for rel in releases:
        vs: dict[str, str] = next((r["versions"] for r in recs if r["release"] == rel and r["versions"]), {})
        lines.append(f"- v{rel}: " + ", ".join(f"{k} `{v}`" for k, v in sorted(vs.items())))
    skips = [(r["tier"], r["release"], s) for r in recs for s in r.get("skip_reasons", [])]
    if skips:
        lines += ["", "Skipped tests and why:", ""]
        lines += [f"- {t} v{rel}: {s}" for t, rel, s in sorted(skips)]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"compat.py: wrote {TABLE.relative_to(REPO)} ({len(recs)} runs, releases {', '.join(releases)})")


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
