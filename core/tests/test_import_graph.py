"""paged_core's packages form layers: every import points down or sideways, and no two packages import each other.

The units are paged_core's top-level packages and modules (``engine_core``, ``config``, ...); the
package's own ``__init__`` is the unit ``paged_core``. Every import counts: module level,
function-local (lazy), under ``TYPE_CHECKING``, ``importlib.import_module("paged_core.x")``, and the
``_LAZY`` name-to-module maps that ``__getattr__`` imports on first use.

The layers, top to bottom:

1. ``cli``: the ``paged`` command.
2. ``serve``: the HTTP server.
3. ``paged_core``, ``api``, ``testing``: the facades (users' names, the vendor contract, backend tests'
   oracles); nothing inside the package imports them.
4. ``frontend``: ``LLM`` and ``LLMEngine``, input and output processing.
5. ``clients``: in-process, thread, multi-process and data-parallel clients of an engine core.
6. ``engine_core``: the core, its wire and process loop, and the tensor-parallel worker ranks.
7. ``loading``: assembling an engine's parts (backend, model, KV cache, scheduler).
8. ``speculative``: draft proposers.
9. ``runner``, ``parallel``: the model runner; tensor-parallel groups, sharding, plans, rank 0's leader.
10. ``sched``, ``sampling``, ``graph``: the scheduler and its requests, sampling, graph capture.
11. ``memory``, ``reference``, ``registry``: KV blocks; the reference backend; the backend registry.
12. ``contract``: what a backend implements (its token-bitmask hook defaults to ``structured``'s).
13. ``quant``, ``structured``, ``lora``: packed weight formats; structured outputs (constraints, compiler,
    matchers); LoRA adapters (requests, loading, device slots).
14. ``engine_config``, ``data_parallel``, ``config``, ``sizes``: configuration.
15. ``errors``, ``extras``, ``_lazy``, ``_version``, ``text``, ``process``: foundations.

The rule: a unit may import units of its own layer or of any layer below it, never above, and the
unit graph has no cycle (so two units of one layer never import each other). A new package must be
placed in a layer here before it can land.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import paged_core

ROOT_PACKAGE = "paged_core"
ROOT = Path(paged_core.__file__).resolve().parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("serve",),
    ("paged_core", "api", "testing"),
    ("frontend",),
    ("clients",),
    ("engine_core",),
    ("loading",),
    ("speculative",),
    ("runner", "parallel"),
    ("sched", "sampling", "graph"),
    ("memory", "reference", "registry"),
    ("contract",),
    ("quant", "structured", "lora"),
    ("engine_config", "data_parallel", "config", "sizes"),
    ("errors", "extras", "_lazy", "_version", "text", "process"),
)
"""Top to bottom; see the module docstring for what each holds."""

Edges = dict[tuple[str, str], list[str]]
"""``(importer, imported) -> ["file:line", ...]`` between distinct units."""


def _unit_of_file(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    if parts == ("__init__.py",):
        return ROOT_PACKAGE
    return parts[0].removesuffix(".py")


def _unit_of_module(module: str, root: Path) -> str | None:
    """The unit ``module`` (a dotted name) belongs to, or None outside the package."""
    parts = module.split(".")
    if parts[0] != ROOT_PACKAGE:
        return None
    if len(parts) == 1:
        return ROOT_PACKAGE
    head = parts[1]
    return head if (root / head).is_dir() or (root / f"{head}.py").is_file() else ROOT_PACKAGE


def _imported_modules(tree: ast.AST, package: str) -> Iterable[tuple[str, int]]:
    """Every ``(dotted module, line)`` the tree imports, wherever the statement stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                # `from paged_core import extras` imports the module paged_core.extras
                yield (f"{module}.{alias.name}" if module == ROOT_PACKAGE else module), node.lineno
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                for value in node.value.values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        yield value.value, value.lineno


def import_edges(root: Path) -> Edges:
    """The unit graph of the package at ``root`` (named :data:`ROOT_PACKAGE`), each edge with where it is made."""
    edges: Edges = {}
    for path in sorted(root.rglob("*.py")):
        source = _unit_of_file(path, root)
        relative = path.relative_to(root).with_suffix("")
        parts = [ROOT_PACKAGE, *relative.parts]
        package = ".".join(parts[:-1])  # the package a relative import starts from (for __init__ too)
        for module, line in _imported_modules(ast.parse(path.read_text(encoding="utf-8")), package):
            target = _unit_of_module(module, root)
            where = f"{path.relative_to(root)}:{line}"
            if target is not None and target != source and where not in edges.get((source, target), []):
                edges.setdefault((source, target), []).append(where)
    return edges


def upward_edges(edges: Mapping[tuple[str, str], list[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import of a unit from a higher layer, and every unit placed in no layer."""
    depth = {unit: i for i, layer in enumerate(layers) for unit in layer}
    found = []
    stray: dict[str, str] = {}
    for (source, target), where in sorted(edges.items()):
        for unit in (source, target):
            if unit not in depth:
                stray.setdefault(unit, where[0])
        if source in depth and target in depth and depth[target] < depth[source]:
            upward = f"{source} (layer {depth[source] + 1}) imports {target} (layer {depth[target] + 1})"
            found.append(f"{upward} at {', '.join(where)}")
    found += [f"{unit} is in no layer (an import edge at {where}): place it in LAYERS" for unit, where in stray.items()]
    return sorted(found)


def cycles(edges: Mapping[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one unit (Tarjan), each sorted; empty when the graph is acyclic."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for nxt in sorted(graph[unit]):
            if nxt not in index:
                visit(nxt)
                low[unit] = min(low[unit], low[nxt])
            elif nxt in on_stack:
                low[unit] = min(low[unit], index[nxt])
        if low[unit] == index[unit]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return sorted(found)


def _cycle_report(edges: Mapping[tuple[str, str], list[str]], component: list[str]) -> str:
    inside = [f"{s} -> {t} ({w[0]})" for (s, t), w in sorted(edges.items()) if s in component and t in component]
    return f"cycle among {component}: " + "; ".join(inside)


# ---- paged_core itself ---------------------------------------------------------------------------


def test_no_package_cycle_in_paged_core() -> None:
    edges = import_edges(ROOT)
    assert len(edges) > 20, "the scan found almost no imports: is ROOT right?"
    assert [_cycle_report(edges, c) for c in cycles(edges)] == []


def test_every_import_points_down_the_layers() -> None:
    assert upward_edges(import_edges(ROOT), LAYERS) == []


def test_every_unit_of_paged_core_has_a_layer() -> None:
    units = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    units = {ROOT_PACKAGE if u == "__init__" else u for u in units}
    placed = [u for layer in LAYERS for u in layer]
    assert len(placed) == len(set(placed)), "a unit is placed in two layers"
    assert sorted(units - set(placed)) == []


# ---- the checker catches what it should (synthetic packages and graphs) --------------------------

LAYERED = (("top",), ("middle", "peer"), ("bottom",))


def test_an_upward_edge_is_named_with_where_it_is_made() -> None:
    edges = {("top", "middle"): ["top/a.py:1"], ("bottom", "middle"): ["bottom/b.py:7"], ("middle", "peer"): ["m:1"]}
    assert upward_edges(edges, LAYERED) == ["bottom (layer 3) imports middle (layer 2) at bottom/b.py:7"]


def test_a_unit_in_no_layer_is_reported() -> None:
    assert upward_edges({("top", "stray"): ["top/a.py:3"]}, LAYERED) == [
        "stray is in no layer (an import edge at top/a.py:3): place it in LAYERS"
    ]


def test_a_cycle_is_found_even_within_one_layer() -> None:
    edges = {("middle", "peer"): ["m:1"], ("peer", "bottom"): ["p:1"], ("bottom", "middle"): ["b:1"]}
    edges[("top", "peer")] = ["t:1"]
    assert cycles(edges) == [["bottom", "middle", "peer"]]
    assert cycles({("top", "middle"): ["t:1"], ("middle", "bottom"): ["m:1"]}) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A synthetic ``paged_core`` whose imports hide in every place the scan must look."""
    root = tmp_path / ROOT_PACKAGE
    for package in ("low", "high", "lazy", "typed", "relative"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text('_LAZY = {"Thing": "paged_core.high.thing"}\n')
    (root / "solo.py").write_text("")
    (root / "high" / "thing.py").write_text("from paged_core.low import x\n")
    (root / "low" / "x.py").write_text("def f():\n    import paged_core.lazy.y\n")
    (root / "lazy" / "y.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from paged_core.typed import z\n"
    )
    (root / "typed" / "z.py").write_text("import importlib\nimportlib.import_module('paged_core.relative.w')\n")
    (root / "relative" / "w.py").write_text("from .. import solo\nfrom ..high import thing\n")
    return root


def test_the_scan_finds_lazy_typing_string_and_relative_imports(planted: Path) -> None:
    edges = import_edges(planted)
    assert sorted(edges) == [
        ("high", "low"),
        ("lazy", "typed"),
        ("low", "lazy"),
        ("paged_core", "high"),
        ("relative", "high"),
        ("relative", "solo"),
        ("typed", "relative"),
    ]
    assert edges[("low", "lazy")] == ["low/x.py:2"]
    assert cycles(edges) == [["high", "lazy", "low", "relative", "typed"]]


def test_importing_the_engine_imports_neither_dynamo_nor_triton() -> None:
    """A Triton backend picks its interpreter mode before anything imports triton, and torch.compile's dynamo
    imports triton: building an engine's modules must leave both unimported (wrap lazily, on first use)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import paged_core, paged_core.loading.build, paged_core.frontend.llm_engine\n"
        "print(sorted(m for m in ('triton', 'torch._dynamo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
