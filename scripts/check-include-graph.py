#!/usr/bin/env python3
"""check-include-graph.py — the code's include graph must have no circle and no arrow back up.

Two checks, each with one verdict line; the exit status is 1 when either fails.

src/pg's modules.  A module is a file stem of src/pg (channel.c and channel.h are the module
"channel"; pg_cai.c, the module entry at the top, is one too).  `#include "y.h"` in either file of
module x, for a y.h that src/pg has, makes x depend on y (`#include "utils/guc.h"` names the
server's header, not src/pg/guc.h).  A module that depends on itself through others cannot be
understood, tested or changed on its own, so any cycle fails.

src/'s folders.  Every folder of src/ stands in FOLDERS below, from the bottom up (src/README.md
says what each owns).  A quoted include is resolved as the compiler does: the including file's
own folder first, then the Makefile's include folders in their order (ENGINE_DIRS for the engine,
the CLI and the backends; PG_CPPFLAGS for src/pg and pg_cai.c); a name found nowhere is a system's
or the server's header.  It fails on an include of a folder that stands higher than the
includer's (an arrow back up, which is also how a circle between folders would show), on a
circle of includes between files of src/, on a folder that directly
holds more than MAX_LINES lines of C (CUDA sources aside), on a backend's own header included
from outside it (PRIVATE), on a folder without a README.md, and
on a header name that two of the engine's include folders share (a quoted include would then
find whichever comes first).

  scripts/check-include-graph.py          the graphs, one module or folder a line, then the verdicts
  scripts/check-include-graph.py --quiet  the verdicts only
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


# src/'s folders from the bottom up: a file may include its own folder's files and those of the
# folders before it.  A new folder must be placed here (and described in src/README.md).
FOLDERS = [
    "src/common",       # cai.h, util, thread pool, safe files, the wire format
    "src/gguf",         # the GGUF file and its tensor formats
    "src/text",         # tokenizers, Unicode
    "src/structured",   # JSON, JSON Schema -> grammar, the matcher, token masks, tool calls
    "src/chat",         # chat templates, reply text
    "src/backend",      # backend.h (the table), KV layout, rope, weights, the weights cache file
    "src/backend/cpu",  # the table on the CPU (the model creates it)
    "src/model/arch",   # one data file per architecture
    "src/model",        # configuration, loading, conversion, calibration, the forward
    "src/backend/cuda", # the table on CUDA (a shared object the model's loader opens)
    "src/engine",       # requests, scheduler, prefix cache, sampler
    "src/serve",        # the engine process's serving loop
    "src/cli",          # the `cai` program
    "src/pg",           # the extension
    ".",                # pg_cai.c, the module entry
]
# A backend's own headers are its business: the model reaches a backend only through backend.h's
# table, so outside the backend's folder only these may include them (the engine reports and
# may force the CPU's ISA).
PRIVATE = {
    "src/backend/cpu": {"src/backend/cpu", "src/engine"},
    "src/backend/cuda": {"src/backend/cuda"},
}
MAX_LINES = 12000
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def makefile_dirs(var):
    """The folders that the Makefile's variable var names (-Idir words or bare words)."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^" + var + r"\s*:?=(.*)$", text, re.M)
    if not m:
        raise SystemExit(f"Makefile: no {var}")
    return [w[2:] if w.startswith("-I") else w for w in m.group(1).split()]


def src_files():
    """{folder: [file paths]}: every folder of src/ (recursively) and pg_cai.c's."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "src")):
        dirnames.sort()
        rel = os.path.relpath(dirpath, ROOT)
        out[rel] = sorted(os.path.join(rel, n) for n in filenames if n.endswith(SOURCE_EXT))
    out["."] = ["pg_cai.c"]
    return out


def search_path(folder, engine_dirs, pg_dirs):
    """Where a quoted include of a file of folder is looked for, after the folder itself."""
    if folder in ("src/pg", "."):
        return pg_dirs
    # the CLI and the CUDA backend are built with their own folder added after the engine's
    return engine_dirs + ["src/backend/cuda", "src/cli"]


def resolve(path, inc, dirs):
    """The file of the tree that `#include "inc"` in path names, or None (a system header)."""
    for d in [os.path.dirname(path)] + dirs:
        cand = os.path.normpath(os.path.join(d, inc))
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    return None


def folder_check(quiet):
    engine_dirs = makefile_dirs("ENGINE_DIRS")
    pg_dirs = [d for d in makefile_dirs("PG_CPPFLAGS")]
    files = src_files()
    rank = {f: i for i, f in enumerate(FOLDERS)}
    problems = []

    for folder, paths in sorted(files.items()):
        if folder not in rank and paths:
                problems.append(f"{folder}: not in FOLDERS (scripts/check-include-graph.py)")
        if folder != "." and not os.path.isfile(os.path.join(ROOT, folder, "README.md")):
            problems.append(f"{folder}: no README.md")
        lines = 0
        for p in paths:
            if p.endswith((".c", ".h")):
                with open(os.path.join(ROOT, p), encoding="utf-8") as f:
                    lines += sum(1 for _ in f)
        if lines > MAX_LINES:
            problems.append(f"{folder}: {lines} lines of C, more than {MAX_LINES}")

    # a header name in two include folders: which one "name.h" means depends on the order
    seen = {}
    for d in engine_dirs:
        for p in files.get(d, []):
            name = os.path.basename(p)
            if name.endswith((".h", ".cuh")):
                if name in seen:
                    problems.append(f"{name}: in {seen[name]} and {d}")
                seen.setdefault(name, d)

    folder_of = {p: f for f, paths in files.items() for p in paths}
    file_edges, folder_edges = {}, {}
    for folder, paths in files.items():
        dirs = search_path(folder, engine_dirs, pg_dirs)
        for p in paths:
            file_edges.setdefault(p, set())
            with open(os.path.join(ROOT, p), encoding="utf-8") as f:
                incs = INCLUDE.findall(f.read())
            for inc in incs:
                target = resolve(p, inc, dirs)
                if target is None or target not in folder_of:
                    continue
                if target != p:
                    file_edges[p].add(target)
                to = folder_of[target]
                if to != folder:
                    folder_edges.setdefault(folder, set()).add(to)
                    if folder in rank and to in rank and rank[to] > rank[folder]:
                        problems.append(f"{p} includes {target}: {to} stands above {folder}")
                    if to in PRIVATE and folder not in PRIVATE[to]:
                        problems.append(f"{p} includes {target}: {to}'s headers are its own "
                                        "(reach it through backend.h's table)")

    edges = {v: sorted(w) for v, w in file_edges.items()}
    for comp in cycles(edges):
        problems.append("circle among " + ", ".join(comp) + ": " + " -> ".join(one_cycle(edges, comp)))

    if not quiet:
        for f in FOLDERS:
            print(f"{f} -> {' '.join(sorted(folder_edges.get(f, []), key=lambda d: rank.get(d, -1))) or '(nothing)'}")
    for p in problems:
        print(p)
    n_folders = sum(1 for f in files if files[f] and f != ".")
    if problems:
        print(f"src/ folder graph: {len(problems)} problem(s)")
        return 1
    print(f"src/ folder graph: {n_folders} folders in order, {len(edges)} files, no circle, "
          "no arrow back up")
    return 0


def main():
    quiet = "--quiet" in sys.argv[1:]
    rc = pg_check(quiet)
    return max(rc, folder_check(quiet))


def pg_check(quiet):
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
