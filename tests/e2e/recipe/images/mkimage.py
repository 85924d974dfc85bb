#!/usr/bin/env python3
"""Make the real node's only two images locally, since no registry is reachable from these machines.

A docker-archive tarball (for ``ctr images import``) with two images sharing one layer: a root filesystem with
Debian's static busybox and a link per applet.

* ``registry.k8s.io/pause:3.10``: sleeps forever (the pod sandbox; containerd v2's default sandbox image);
* ``local/busybox:1``: ``sh``.

usage: mkimage.py OUT.tar [BUSYBOX=/bin/busybox]
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile

PAUSE = "registry.k8s.io/pause:3.10"
BUSYBOX = "local/busybox:1"
EPOCH = "1970-01-01T00:00:00Z"


def _add(tf: tarfile.TarFile, name: str, *, data: bytes = b"", mode: int = 0o755, kind: bytes = tarfile.REGTYPE,
         target: str = "") -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
    ti.type, ti.mode = kind, mode
    if kind == tarfile.SYMTYPE:
        ti.linkname = target
        tf.addfile(ti)
    elif kind == tarfile.DIRTYPE:
        tf.addfile(ti)
    else:
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))


def _layer(busybox: str) -> bytes:
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "tmp", "proc", "sys", "dev", "root", "var", "home"):
            _add(tf, d + "/", kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        with open(busybox, "rb") as f:
            _add(tf, "bin/busybox", data=f.read())
        seen = {"bin/busybox"}
        for a in (x.lstrip("/") for x in applets):  # e.g. usr/bin/env, sbin/ifconfig
            if a not in seen and "/" in a:
                seen.add(a)
                _add(tf, a, kind=tarfile.SYMTYPE, target="/bin/busybox")
        _add(tf, "etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", mode=0o644)
        _add(tf, "etc/group", data=b"root:x:0:\nnogroup:x:65534:\n", mode=0o644)
    return buf.getvalue()


def _config(diff_id: str, entrypoint: list[str] | None, cmd: list[str] | None) -> bytes:
    c = {"architecture": "amd64", "os": "linux", "created": EPOCH,
         "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                    "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
         "history": [{"created": EPOCH, "created_by": "mkimage.py (busybox-static)"}]}
    return json.dumps(c, sort_keys=True, separators=(",", ":")).encode()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out, busybox = argv[1], argv[2] if len(argv) == 3 else "/bin/busybox"
    layer = _layer(busybox)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    images = [([PAUSE], _config(diff_id, ["/bin/sleep", "2147483647"], None)), ([BUSYBOX], _config(diff_id, None, ["sh"]))]
    with tarfile.open(out, "w") as tf:
        digest = diff_id.split(":")[1]
        layer_name = digest + "/layer.tar"
        _add(tf, digest + "/", kind=tarfile.DIRTYPE)
        _add(tf, layer_name, data=layer, mode=0o644)
        manifest = []
        for tags, cfg in images:
            cname = hashlib.sha256(cfg).hexdigest() + ".json"
            _add(tf, cname, data=cfg, mode=0o644)
            manifest.append({"Config": cname, "RepoTags": tags, "Layers": [layer_name]})
        _add(tf, "manifest.json", data=json.dumps(manifest).encode(), mode=0o644)
    print(f"{out}: layer {diff_id} ({len(layer)} bytes), images {[t for t, _ in images]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
