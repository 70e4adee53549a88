#!/usr/bin/env python3
"""check-include-graph.py — src/pg's modules must depend on each other without a circle.

A module is a file stem of src/pg (channel.c and channel.h are the module "channel"; pg_cai.c, the
module entry at the top, is one too).  `#include "y.h"` in either file of module x, for a y.h
that src/pg has, makes x depend on y (`#include "utils/guc.h"` names the server's header, not
src/pg/guc.h).  A module that depends on itself through others cannot be
understood, tested or changed on its own, so any cycle fails this check (exit status 1).

  scripts/check-include-graph.py          the graph, one module a line, then the verdict
  scripts/check-include-graph.py --quiet  the verdict only
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = os.path.join(ROOT, "src", "pg")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules():
    """{module: [paths]} for src/pg/*.c, src/pg/*.h and the top-level pg_cai.c."""
    mods = {}
    for name in sorted(os.listdir(PG)):
        stem, ext = os.path.splitext(name)
        if ext in (".c", ".h"):
            mods.setdefault(stem, []).append(os.path.join(PG, name))
    mods.setdefault("pg_cai", []).append(os.path.join(ROOT, "pg_cai.c"))
    return mods


def graph(mods):
    headers = {stem for stem, paths in mods.items() if any(p.endswith(".h") for p in paths)}
    edges = {}
    for stem, paths in mods.items():
        deps = set()
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for inc in INCLUDE.findall(f.read()):
                    # "utils/guc.h" is the server's header, not src/pg/guc.h: only a bare
                    # name can be one of src/pg's
                    dep = os.path.splitext(inc)[0]
                    if "/" not in inc and inc.endswith(".h") and dep in headers and dep != stem:
                        deps.add(dep)
        edges[stem] = sorted(deps)
    return edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan), each as a list."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def one_cycle(edges, comp):
    """A shortest path from comp's first module back to itself, inside comp."""
    start, members = comp[0], set(comp)
    paths, queue = {start: [start]}, [start]
    while queue:
        v = queue.pop(0)
        for w in edges[v]:
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return comp


def main():
    quiet = "--quiet" in sys.argv[1:]
    edges = graph(modules())
    if not quiet:
        for v in sorted(edges):
            print(f"{v} -> {' '.join(edges[v]) or '(nothing)'}")
    found = cycles(edges)
    if not found:
        print(f"src/pg include graph: {len(edges)} modules, no cycle")
        return 0
    for comp in found:
        print("cycle among " + ", ".join(comp) + ": " + " -> ".join(one_cycle(edges, comp)))
    print(f"src/pg include graph: {len(found)} cycle(s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
