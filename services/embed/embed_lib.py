#!/usr/bin/env python3
"""embed_lib: one service core and everything it links from this tree as one
relocatable object in a static library, with only its API left global.

A trainer that embeds a core links it beside its own code and libraries. The
tree's static libraries define generic global names (log_event, kv_open,
strbuf_printf, shm_ring_create, storage_get, ...) that such a
program may define too: the link fails ("multiple definition") or, worse,
the core silently calls the program's function. Renaming every internal
symbol would touch most files; instead, at build time:

  1. ld -r --whole-archive ARCHIVES: one relocatable object, the references
     between the core's files and services/common resolved inside it;
  2. objcopy --keep-global-symbols: every defined global becomes local
     except the API: functions and objects named in the core's public
     HEADERS, and the project-prefixed shared names (stk_* errors,
     stoker__v1__* protobuf-c messages the API takes);
  3. objcopy --weaken-symbols for the shared names, so that two embedded
     cores linked into one program (each carries the same copy of
     services/common and the messages) do not clash with each other;
  4. ar: the object as a static library.

Undefined references (RocksDB, libuv, protobuf-c, ...) stay as they are: the
program links those libraries as it would for the plain static libraries.

Usage: embed_lib.py --ld LD --objcopy OBJCOPY --ar AR --nm NM
           --out LIB.a --header H [--header H ...] ARCHIVE...
Writes LIB.a and LIB.a.symbols (the global symbols left, one a line).
"""

import argparse
import os
import re
import subprocess
import sys

SHARED_PREFIXES = ("stk_", "stoker__v1__")


def run(*cmd):
    subprocess.run(cmd, check=True)


def defined_globals(nm, obj):
    out = subprocess.run(
        [nm, "-g", "--defined-only", obj], check=True, capture_output=True, text=True
    ).stdout
    return sorted({line.split()[-1] for line in out.splitlines() if len(line.split()) == 3})


def header_identifiers(paths):
    names = set()
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/", " ", f.read(), flags=re.S)
        names.update(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text))
    return names


def main():
    ap = argparse.ArgumentParser()
    for tool in ("ld", "objcopy", "ar", "nm"):
        ap.add_argument("--" + tool, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--header", action="append", required=True)
    ap.add_argument("archives", nargs="+")
    a = ap.parse_args()

    obj = a.out + ".o"
    run(a.ld, "-r", "-o", obj, "--whole-archive", *a.archives, "--no-whole-archive")
    api = header_identifiers(a.header)
    defined = defined_globals(a.nm, obj)
    keep = [s for s in defined if s in api or s.startswith(SHARED_PREFIXES)]
    weak = [s for s in keep if s.startswith(SHARED_PREFIXES)]
    if not any(s in api for s in keep):
        sys.exit(f"embed_lib: no function of {a.header} is defined in {a.archives}")
    keep_file, weak_file = a.out + ".keep", a.out + ".weak"
    with open(keep_file, "w") as f:
        f.write("".join(s + "\n" for s in keep))
    with open(weak_file, "w") as f:
        f.write("".join(s + "\n" for s in weak))
    run(a.objcopy, "--keep-global-symbols=" + keep_file, "--weaken-symbols=" + weak_file, obj)
    if os.path.exists(a.out):
        os.remove(a.out)
    run(a.ar, "rcsD", a.out, obj)
    with open(a.out + ".symbols", "w") as f:
        f.write("".join(s + "\n" for s in defined_globals(a.nm, obj)))
    for p in (obj, keep_file, weak_file):
        os.remove(p)


if __name__ == "__main__":
    main()
