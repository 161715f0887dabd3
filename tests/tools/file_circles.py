#!/usr/bin/env python3
"""Circles of C files that call each other, read from the compiled objects.

For every object (a .o, or each member of a static library .a) `nm` gives
the global symbols it defines and the ones it leaves undefined. File A
depends on file B when A uses a symbol B defines. A circle is a strongly
connected component of that graph with more than one file: A calls B and B
calls A, or a longer loop. Static functions are not global, so a file's
calls to itself never count.

    file_circles.py [--nm NM] [--edges] [--check] FILE.a|FILE.o ...

Prints one line per circle (its files, sorted) and a count. --edges also
prints, per file, the files it depends on. --check exits 1 when there is a
circle (for a test), and 77 (skipped) when nm reads no symbols or no calls
between the files, as it may not in an LTO build.
"""

import argparse
import subprocess
import sys

DEFINED = set("ABCDGRSTVWi")  # nm's letters for defined globals.


def read_symbols(nm: str, paths: list[str]) -> dict[str, tuple[set[str], set[str]]]:
    """Maps each object's name to (defined, undefined) global symbols."""
    files: dict[str, tuple[set[str], set[str]]] = {}
    for path in paths:
        out = subprocess.run([nm, "-g", path], check=True, capture_output=True, text=True).stdout
        # An archive prints "member.o:" before each member; an object does not.
        name = path.rsplit("/", 1)[-1]
        for line in out.splitlines():
            if not line.strip():
                continue
            if line.endswith(":") and " " not in line:
                name = line[:-1]
                continue
            parts = line.split()
            if len(parts) < 2:
                continue
            kind, sym = parts[-2], parts[-1]
            defined, undefined = files.setdefault(name.removesuffix(".o"), (set(), set()))
            if kind == "U":
                undefined.add(sym)
            elif kind in DEFINED:
                defined.add(sym)
    return files


def build_graph(files: dict[str, tuple[set[str], set[str]]]) -> dict[str, set[str]]:
    owner = {sym: f for f, (defined, _) in files.items() for sym in defined}
    return {
        f: {owner[s] for s in undefined if s in owner and owner[s] != f}
        for f, (_, undefined) in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--edges", action="store_true", help="print each file's dependencies")
    ap.add_argument("--check", action="store_true", help="exit 1 on a circle, 77 if unreadable")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    files = read_symbols(args.nm, args.paths)
    if not any(defined for defined, _ in files.values()):
        print("no global symbols read (LTO objects?): nothing to check")
        return 77 if args.check else 1
    # Thin archives name their members by path: the base name suffices when unique.
    short = {f: f.rsplit("/", 1)[-1] for f in files}
    if len(set(short.values())) == len(short):
        files = {short[f]: v for f, v in files.items()}
    graph = build_graph(files)
    if args.check and not any(graph.values()):
        print("no calls between files read: nothing to check")
        return 77
    if args.edges:
        for f in sorted(graph):
            print(f"{f} -> {' '.join(sorted(graph[f])) or '(none)'}")
    found = circles(graph)
    for c in found:
        print(f"circle of {len(c)}: {' '.join(c)}")
    print(f"{len(graph)} files, {len(found)} circles, {sum(map(len, found))} files in circles")
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
