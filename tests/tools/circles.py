#!/usr/bin/env python3
"""circles.py: the circles of files that call each other, read from object files.

Usage: circles.py DIR [DIR...]   (e.g. build/services/dataloader)

Every *.o under the directories is one node, named after its source file
(meson writes dl_core.c.o; the same source built into two targets is one
node). `nm` gives each object's defined global symbols and its undefined
ones; a file that uses a symbol another file defines has an arrow to it.
The strongly connected components of more than one file are the circles:
each is printed with the arrows inside it and one symbol behind each.
Exit status 1 when there is a circle, so it can serve as a check.
No dependencies beyond Python 3 and nm.
"""
import os
import subprocess
import sys


def objects(dirs: list[str]) -> dict[str, list[str]]:
    """Node name -> the object files built from that source."""
    nodes: dict[str, list[str]] = {}
    for top in dirs:
        for root, _, files in os.walk(top):
            for f in sorted(files):
                if f.endswith(".o"):
                    nodes.setdefault(f[:-2], []).append(os.path.join(root, f))
    return nodes


def symbols(obj: str) -> tuple[set[str], set[str]]:
    """(defined global symbols, undefined symbols) of one object."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined: set[str] = set()
    undefined: set[str] = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, undefined


def graph(nodes: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """node -> {node it uses: one symbol behind the arrow}."""
    owner: dict[str, str] = {}
    uses: dict[str, set[str]] = {}
    for node, objs in nodes.items():
        uses[node] = set()
        for obj in objs:
            defined, undefined = symbols(obj)
            for s in defined:
                owner[s] = node
            uses[node] |= undefined
    edges: dict[str, dict[str, str]] = {n: {} for n in nodes}
    for node, syms in uses.items():
        for s in sorted(syms):
            to = owner.get(s)
            if to and to != node:
                edges[node].setdefault(to, s)
    return edges


def components(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    nodes = objects(argv)
    edges = graph(nodes)
    circles = sorted((c for c in components(edges) if len(c) > 1), key=lambda c: (-len(c), c))
    for i, comp in enumerate(circles, 1):
        print(f"circle {i}: {len(comp)} files: {' '.join(comp)}")
        for a in comp:
            for b, sym in sorted(edges[a].items()):
                if b in comp:
                    print(f"  {a} -> {b} ({sym})")
    held = sum(len(c) for c in circles)
    print(f"{len(nodes)} files, {len(circles)} circles holding {held} files")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
