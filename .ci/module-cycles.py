#!/usr/bin/env python3
"""Finds import cycles between the modules of a crate.

usage: module-cycles.py SRC_DIR...

Each file under SRC_DIR is a module (`a/b.rs` and `a/b/mod.rs` are `a::b`;
`lib.rs` and `main.rs` are the crate root). A module depends on another
when it names it by path: `crate::a::b`, `super::x`, `self::x`, or a child
module by its bare name. The check is made at every level of the module
tree: the modules that share a parent (the crate's top-level modules, the
children of `service`, ...) must depend on each other without a cycle,
where a module stands for itself and everything below it. A module naming
its own parent or its own children (a type defined in `mod.rs` with its
`impl` blocks in child modules) is inside one unit and not a cycle. Prints
each cycle found and exits 1 when there is one.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_]\w*)+|::\{)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_]\w*)*)::\{([^}]*)\}", re.S)


def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]) or rel[:1] == ["bin"]:
                rel = []
            mods[tuple(rel)] = os.path.join(root, f)
    return mods


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def resolve(mods, base, names):
    """The longest module named by `base` + `names`."""
    path = list(base)
    best = None
    for n in names:
        path.append(n)
        if tuple(path) in mods:
            best = tuple(path)
        else:
            break
    return best


def edges(mods, mod, text):
    out = set()

    def add(kind, names):
        if kind == "crate":
            base = ()
        elif kind == "super":
            base = mod[:-1]
        else:
            base = mod
        names = [n for n in names if n]
        while names and names[0] == "super":
            base = base[:-1]
            names = names[1:]
        target = resolve(mods, base, names)
        if target is None and kind == "super":
            target = base  # an item of the parent itself
        if target is not None and target != mod and target != ():
            out.add(target)

    for m in GROUP.finditer(text):
        prefix = [n for n in m.group(2).split("::") if n]
        for item in m.group(3).split(","):
            first = item.strip().split("::")
            add(m.group(1), prefix + [first[0].strip()] + [x.strip() for x in first[1:]])
    for m in PATH.finditer(text):
        add(m.group(1), [n for n in m.group(2).split("::") if n and n != "{"])
    # Children named by their bare path (`child::Item`, `use child::X`).
    for child in (k for k in mods if len(k) == len(mod) + 1 and k[: len(mod)] == mod):
        out.add(child)
    return out


def cycles(graph):
    found, index, low, stack, on, n = [], {}, {}, [], set(), [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return found


def levels(deps):
    """Per parent module, the graph between its children (each standing
    for its whole subtree)."""
    out = {}
    for m, targets in deps.items():
        for t in targets:
            common = 0
            while common < min(len(m), len(t)) and m[common] == t[common]:
                common += 1
            if common == len(m) or common == len(t):
                continue  # an ancestor or a descendant: the same unit
            parent = m[:common]
            a, b = m[: common + 1], t[: common + 1]
            out.setdefault(parent, {}).setdefault(a, set()).add(b)
    return out


def main():
    bad = 0
    for src in sys.argv[1:]:
        mods = modules(src)
        deps = {}
        for mod, path in mods.items():
            if mod == ():
                continue
            with open(path, encoding="utf-8") as f:
                deps[mod] = edges(mods, mod, strip(f.read()))
        for parent, graph in sorted(levels(deps).items()):
            for comp in cycles(graph):
                bad = 1
                where = "::".join(parent) or "the crate root"
                names = sorted("::".join(m) for m in comp)
                print(f"{src}: import cycle under {where}: {', '.join(names)}")
                for m in sorted(comp):
                    inside = sorted("::".join(t) for t in graph[m] if t in comp)
                    print(f"  {'::'.join(m)} -> {', '.join(inside)}")
    sys.exit(bad)


if __name__ == "__main__":
    main()
