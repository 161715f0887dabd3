#!/usr/bin/env python3
"""link_check: what a program with names of its own that the cores use inside
gets from the plain static libraries and from the embeddable ones
(services/embed), decided by the linker alone:

1. It defines kv_open, crc32c, strbuf_append and storage_open and calls
   into every core: the plain archives fail the link ("multiple
   definition of `kv_open'" and each of the others); the embeddable ones link.
2. It defines crc32c and crc32c_extend, all that services/common's crc32c.o
   defines, and calls dl_export_state: the plain archives link without a
   word, and the linker's trace shows the core's reference to crc32c bound
   to the program's function (the core would checksum its state with it);
   against the embeddable library the core's references are its own (no
   reference to crc32c from the library).

External libraries (RocksDB, libuv, ...) are left out of the links
(unresolved symbols ignored): only how names bind is checked here;
test_embed_clash.c runs such a program.

Usage: link_check.py CC... --plain LIB.a... --embed LIB.a...
"""

import os
import subprocess
import sys
import tempfile

CLASHING = ["kv_open", "crc32c", "strbuf_append", "storage_open"]
CLASH_SOURCE = (
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
SILENT_SOURCE = """
int crc32c(void);
int crc32c(void) { return 0; }
int crc32c_extend(void);
int crc32c_extend(void) { return 0; }
int dl_export_state(void);
int (*volatile core)(void) = dl_export_state;
int main(void) {
  return core == 0;
}
"""


def link(cc, d, source, libs, extra=()):
    src = os.path.join(d, "prog.c")
    with open(src, "w") as f:
        f.write(source)
    ignore = "-Wl,--unresolved-symbols=ignore-all"
    out = os.path.join(d, "prog")
    cmd = [*cc, src, "-o", out, ignore, *extra, "-Wl,--start-group", *libs, "-Wl,--end-group"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check_clash(cc, d, plain, embed):
    rc, out = link(cc, d, CLASH_SOURCE, plain)
    missing = [n for n in CLASHING if f"multiple definition of `{n}'" not in out]
    if rc == 0 or missing:
        print(f"plain static libraries: exit {rc}, no clash reported for {missing}:\n{out}")
        return False
    print(f"plain static libraries: the link fails ({len(CLASHING)} names clash)")
    rc, out = link(cc, d, CLASH_SOURCE, embed)
    if rc != 0:
        print(f"embeddable libraries: the link failed:\n{out}")
        return False
    print("embeddable libraries: it links")
    return True


def check_silent(cc, d, plain, embed):
    trace = ["-Wl,--trace-symbol=crc32c"]
    rc, out = link(cc, d, SILENT_SOURCE, plain, trace)
    core_refs = [ln for ln in out.splitlines() if "libstk_dl_core.a" in ln and "reference" in ln]
    if rc != 0 or not core_refs:
        print(
            f"plain static libraries: expected a silent link binding the core to the program's "
            f"crc32c; exit {rc}:\n{out}"
        )
        return False
    print(f"plain static libraries: links silently, and {core_refs[0].strip()}")
    rc, out = link(cc, d, SILENT_SOURCE, embed, trace)
    refs = [ln for ln in out.splitlines() if "embed" in ln and "reference" in ln]
    if rc != 0 or refs:
        print(f"embeddable libraries: exit {rc}, references to the program's crc32c:\n{out}")
        return False
    print("embeddable libraries: the core keeps its own crc32c")
    return True


def main():
    args = sys.argv[1:]
    cc = args[: args.index("--plain")]
    plain = args[args.index("--plain") + 1 : args.index("--embed")]
    embed = args[args.index("--embed") + 1 :]
    with tempfile.TemporaryDirectory() as d:
        ok = check_clash(cc, d, plain, embed)
        ok = check_silent(cc, d, plain, embed) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
