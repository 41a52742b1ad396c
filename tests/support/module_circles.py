"""Circles among a crate's modules: a path `crate::a::...` in module b
(an import, a use in code or a doc link; tests left out) makes an edge
b -> a, and so does `super::a`. Prints each strongly connected component
of more than one module, per crate under `crates/`, then the count.

    python3 tests/support/module_circles.py    # from the repository root
"""
import os, re, sys
from collections import defaultdict

def modules(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] in ('mod', 'lib', 'main'):
                parts = parts[:-1]
            mods['::'.join(parts)] = path
    return mods

def edges(mods):
    g = defaultdict(set)
    names = set(mods)
    for m, path in mods.items():
        text = open(path).read()
        # Tests are left out.
        text = text.split('#[cfg(test)]\nmod tests')[0]
        for hit in re.findall(r'crate::((?:\w+::)*\w+)', text):
            parts = hit.split('::')
            for i in range(len(parts), 0, -1):
                cand = '::'.join(parts[:i])
                if cand in names:
                    # A module's own parents and children are not circles.
                    related = m.startswith(cand + '::') or cand.startswith(m + '::')
                    if cand != m and not related:
                        g[m].add(cand)
                    break
        # super:: references
        for hit in re.findall(r'super::(\w+)', text):
            parent = m.rsplit('::', 1)[0] if '::' in m else ''
            cand = (parent + '::' + hit) if parent else hit
            if cand in names and cand != m:
                g[m].add(cand)
    return g

def sccs(nodes, g):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in nodes:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]

total = 0
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
for crate in sorted(os.listdir('crates')):
    src = os.path.join('crates', crate, 'src')
    if not os.path.isdir(src):
        continue
    mods = modules(src)
    found = sccs(sorted(mods), edges(mods))
    for c in found:
        print(f'{crate}: {" <-> ".join(sorted(c))}')
    total += len(found)
print(f'{total} circles')
