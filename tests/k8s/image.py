#!/usr/bin/env python3
"""Make a one-layer image archive (the docker-archive format that `podman
save` writes and `ctr images import` reads) from files of this machine, for
the cluster's own small images: the pod sandbox (pause), CoreDNS, and a
busybox image the checks run nslookup and wget from. No registry is
reachable here, and these need no base image.

    image.py OUT.tar NAME:TAG --file SRC:DEST[:MODE] ... [--link DEST:TARGET ...]
             [--entrypoint JSON-LIST] [--cmd JSON-LIST] [--user UID]
"""

import argparse
import hashlib
import io
import json
import os
import tarfile
import time


def layer_bytes(files: list[str], links: list[str]) -> bytes:
    """One uncompressed layer tar: the files, their parent folders, links, /tmp."""
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def folder(path: str, mode: int = 0o755) -> None:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in seen:
                    seen.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o1777 if d == "tmp" else mode
                    tar.addfile(info)

        folder("tmp")
        for spec in files:
            src, dest, *mode = spec.split(":")
            folder(os.path.dirname(dest))
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size = len(data)
            info.mode = int(mode[0], 8) if mode else os.stat(src).st_mode & 0o7777
            tar.addfile(info, io.BytesIO(data))
        for spec in links:
            dest, target = spec.split(":", 1)
            folder(os.path.dirname(dest))
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--link", action="append", default=[])
    p.add_argument("--entrypoint", type=json.loads)
    p.add_argument("--cmd", type=json.loads)
    p.add_argument("--user", default="")
    a = p.parse_args()

    layer = layer_bytes(a.file, a.link)
    layer_id = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "Entrypoint": a.entrypoint,
            "Cmd": a.cmd,
            "User": a.user,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"],
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_id]},
    }
    config_bytes = json.dumps(config).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {"Config": config_id + ".json", "RepoTags": [a.name], "Layers": [layer_id + "/layer.tar"]}
    ]
    with tarfile.open(a.out, "w") as out:
        for name, data in (
            (config_id + ".json", config_bytes),
            (layer_id + "/layer.tar", layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
