#!/usr/bin/env python3
"""link_check: a program that defines kv_open, crc32c, strbuf_append,
storage_open and attempt_find and calls into every service core fails to
link against the plain static libraries ("multiple definition of `kv_open'"
and the others) and links against the embeddable ones (services/embed).
External libraries (RocksDB, libuv, ...) are left out of both links
(unresolved symbols ignored): only clashes between names are checked here;
test_embed_clash.c runs such a program.

Usage: link_check.py CC... --plain LIB.a... --embed LIB.a...
"""

import os
import subprocess
import sys
import tempfile

CLASHING = ["kv_open", "crc32c", "strbuf_append", "storage_open", "attempt_find"]
SOURCE = (
    "".join(f"int {n}(void);\nint {n}(void) {{ return 1; }}\n" for n in CLASHING)
    + """
int dl_open(void);
int ckpt_service_open(void);
int coord_open(void);
int (*volatile cores[])(void) = {dl_open, ckpt_service_open, coord_open};
int main(void) {
  return cores[0] == 0;
}
"""
)


def link(cc, src, libs, out):
    ignore = "-Wl,--unresolved-symbols=ignore-all"
    cmd = [*cc, src, "-o", out, ignore, "-Wl,--start-group", *libs, "-Wl,--end-group"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    args = sys.argv[1:]
    cc = args[: args.index("--plain")]
    plain = args[args.index("--plain") + 1 : args.index("--embed")]
    embed = args[args.index("--embed") + 1 :]
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "clash.c")
        with open(src, "w") as f:
            f.write(SOURCE)
        rc, out = link(cc, src, plain, os.path.join(d, "plain"))
        missing = [n for n in CLASHING if f"multiple definition of `{n}'" not in out]
        if rc == 0 or missing:
            print(f"plain static libraries: exit {rc}, no clash reported for {missing}:\n{out}")
            return 1
        print(f"plain static libraries: link fails as expected ({len(CLASHING)} clashes)")
        rc, out = link(cc, src, embed, os.path.join(d, "embed"))
        if rc != 0:
            print(f"embeddable libraries: link failed:\n{out}")
            return 1
        print("embeddable libraries: links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
