"""The module import graph of src/lingua_fusion, from the source (ast; nothing is imported), and its cycles.

    python scripts/import_graph.py           # cycles (all imports, then import-time only), product -> lab
    python scripts/import_graph.py --edges   # also print every edge

Every ``import`` and ``from ... import`` counts, including those inside functions ("lazy": they cannot fail
at import time but still tie the modules together) and under ``if TYPE_CHECKING``. ``from pkg import name``
points at the module ``pkg.name`` when there is one, else at ``pkg`` (its ``__init__``). Implicit edges to
parent packages are not drawn.

Exit status 1 on any cycle (function-level and TYPE_CHECKING imports count), when the product imports lab/ other
than lazily from ``cli/lab.py`` or ``cli/stream.py``, or when stream/, files/ or rooms/ import anything of
serving/ beyond its declared face (``FACE``: the ports, the model keys and the Engine Protocol).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "lingua_fusion"
LAB = f"{PACKAGE}.lab"
LAB_ALLOWED = {f"{PACKAGE}.cli.lab", f"{PACKAGE}.cli.stream"}  # may import lab/, inside functions only
# serving's declared face (serving/engine.py): all that streams, file requests and rooms may import of serving/
FACE = {f"{PACKAGE}.serving.{m}" for m in ("ports", "keys", "engine")}
FACE_USERS = tuple(f"{PACKAGE}.{p}" for p in ("stream", "files", "rooms"))


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    lazy: bool  # inside a function (or a TYPE_CHECKING block): not run when the module is imported


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _resolve(base: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of ``base`` that is one of our modules (None when outside the package)."""
    parts = base.split(".")
    while parts:
        name = ".".join(parts)
        if name in mods:
            return name
        parts.pop()
    return None


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it sits in a function body or an ``if TYPE_CHECKING`` block."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, lazy = stack.pop()
        yield node, lazy
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and child in node.body:
                inner = True
            stack.append((child, inner))


def edges(mods: dict[str, Path]) -> list[Edge]:
    out = []
    for name, path in mods.items():
        here = name if _is_package(name, mods) else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, lazy in _walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = here.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                dst = _resolve(t, mods)
                if dst is not None and dst != name:
                    out.append(Edge(name, dst, node.lineno, lazy))
    return sorted(set(out), key=lambda e: (e.src, e.dst, e.line))


def cycles(nodes: list[str], es: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for e in es:
        graph[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for n in sorted(graph):
        if n not in index:
            visit(n)
    return sorted(out)


def a_cycle(comp: list[str], es: list[Edge]) -> list[Edge]:
    """One concrete loop through a component from its first module (the shortest: breadth-first search)."""
    inside = set(comp)
    by_src: dict[str, list[Edge]] = {}
    for e in es:
        if e.src in inside and e.dst in inside:
            by_src.setdefault(e.src, []).append(e)
    start = comp[0]
    prev: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in by_src.get(v, []):
                if e.dst == start:
                    path = [e]
                    while path[0].src != start:
                        path.insert(0, prev[path[0].src])
                    return path
                if e.dst not in prev:
                    prev[e.dst] = e
                    nxt.append(e.dst)
        frontier = nxt
    return []


def subpackage(m: str) -> str:
    """lingua_fusion.X for the product, lingua_fusion.lab.X inside lab/."""
    parts = m.split(".")
    return ".".join(parts[:3] if m.startswith(LAB + ".") else parts[:2])


def mods_line(es: list[Edge], folded: Edge) -> str:
    """The first module edge behind a folded subpackage edge, as 'a.b -> c.d'."""
    e = next(e for e in es if subpackage(e.src) == folded.src and subpackage(e.dst) == folded.dst
             and e.line == folded.line and e.lazy == folded.lazy)
    return f"{e.src.rpartition('.')[2]} -> {e.dst}"


def lab_imports_from_product(es: list[Edge]) -> list[Edge]:
    """Product modules importing lab/ in a way that is not allowed."""
    def in_lab(m: str) -> bool:
        return m == LAB or m.startswith(LAB + ".")

    return [e for e in es if in_lab(e.dst) and not in_lab(e.src) and not (e.src in LAB_ALLOWED and e.lazy)]


def past_the_face(es: list[Edge]) -> list[Edge]:
    """Imports by stream/, files/ or rooms/ of a serving/ module that is not part of its face."""
    serving = f"{PACKAGE}.serving"
    return [e for e in es if e.src.startswith(FACE_USERS) and (e.dst == serving or e.dst.startswith(serving + "."))
            and e.dst not in FACE]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every edge")
    ap.add_argument("--src", type=Path, default=ROOT, help="the folder holding lingua_fusion/ (src/)")
    args = ap.parse_args()
    mods = modules(args.src)
    es = edges(mods)
    if args.edges:
        for e in es:
            print(f"{e.src} -> {e.dst}  (line {e.line}{', lazy' if e.lazy else ''})")
    failed = False
    for title, subset in (("all imports", es), ("import-time imports only", [e for e in es if not e.lazy])):
        comps = cycles(list(mods), subset)
        print(f"cycles, {title}: {len(comps)}")
        for comp in comps:
            loop = a_cycle(comp, subset)
            involves_lab = any(m == LAB or m.startswith(LAB + ".") for m in comp)
            failed = True
            print(f"  {'[lab] ' if involves_lab else ''}{len(comp)} modules: {', '.join(comp)}")
            if loop:
                steps = " -> ".join(f"{e.src} (line {e.line}{', lazy' if e.lazy else ''})" for e in loop)
                print(f"    e.g. {steps} -> {loop[0].src}")
    # Informational: the same graph with every module folded into its subpackage (lab/chaos, lab/eval, ...).
    pes = [Edge(subpackage(e.src), subpackage(e.dst), e.line, e.lazy) for e in es
           if subpackage(e.src) != subpackage(e.dst)]
    pcomps = cycles(sorted({subpackage(m) for m in mods}), pes)
    print(f"loops between subpackages (informational, not module cycles): {len(pcomps)}")
    for comp in pcomps:
        loop = a_cycle(comp, pes)
        print("  " + " -> ".join(f"{e.src} ({mods_line(es, e)})" for e in loop) + f" -> {loop[0].src}")
    bad = lab_imports_from_product(es)
    allowed = [e for e in es if e.src in LAB_ALLOWED and e.dst.startswith(LAB) and e not in bad]
    print(f"product -> lab imports: {len(allowed)} allowed (lazy, in {', '.join(sorted(LAB_ALLOWED))}), "
          f"{len(bad)} not allowed")
    for e in bad:
        print(f"  {e.src} (line {e.line}{', lazy' if e.lazy else ''}) -> {e.dst}")
    failed |= bool(bad)
    past = past_the_face(es)
    print(f"stream/, files/, rooms/ -> serving/ beyond its face ({', '.join(sorted(FACE))}): {len(past)}")
    for e in past:
        print(f"  {e.src} (line {e.line}{', lazy' if e.lazy else ''}) -> {e.dst}")
    failed |= bool(past)
    print("FAIL" if failed else "OK: no import cycle, the product does not import lab/, and streams, files and rooms "
          "use serving through its face only")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
