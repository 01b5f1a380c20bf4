"""The import structure: folders that are layers, pointing one way, no import circles.

The packages are layered (see docs/concepts.md, "Layers"); in ``beam_supertable``
each layer is a folder:

    jobs/ (and pipelines/) -> transforms/, testing/, rag/ -> table/ -> iceberg/
              -> format/ -> vector/, fts/ -> errors

A module may import modules of its own layer or a lower one, never a higher
one, and the graph of modules has no cycle. ``beam_upsert`` imports nothing
from ``beam_supertable``. Imports under ``if TYPE_CHECKING:`` and inside
functions count: an annotation that needs a higher layer is a design smell
the layers exist to prevent.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("beam_upsert", "beam_supertable", "pipelines")

ERRORS, INDEX, STORAGE, ICEBERG, TABLE, BEAM, JOBS = range(7)
LAYER_NAMES = ["errors", "indexes", "storage and format", "the Iceberg face", "table",
               "Beam adapters", "jobs"]

# The folders (and top-level modules) of beam_supertable by layer; one missing
# here fails the test, so a new folder or top-level module must be given its place.
SUPERTABLE_LAYERS = {
    ERRORS: {"errors", "_version", "_program", "_moved"},
    INDEX: {"vector", "fts"},
    STORAGE: {"format"},
    ICEBERG: {"iceberg"},
    TABLE: {"table"},
    BEAM: {"__init__", "__main__", "cli", "cli_alter", "cli_text", "transforms", "testing",
           "rag"},
    JOBS: {"jobs", "yaml"},   # the templated jobs (pipelines/ holds their entry points)
    # and the Beam YAML providers
}
TOP_LEVEL_LIMIT = 12
LINE_LIMIT = 600
LONG_REASON = "Why this module is long:"


def _modules() -> Iterator[Tuple[str, pathlib.Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


MODULES = dict(_modules())


def _resolve(name: str) -> str:
    """The module (of ours) an imported name is, or the package it is taken from."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: pathlib.Path) -> Set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule when there is one.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target and target != module:
                out.add(target)
    return out


GRAPH: Dict[str, Set[str]] = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "pipelines":
        return JOBS
    if parts[0] == "beam_upsert":
        return BEAM   # a library the Beam adapters use; it never imports them back
    name = parts[1] if len(parts) > 1 else "__init__"
    for layer, names in SUPERTABLE_LAYERS.items():
        if name in names:
            return layer
    raise AssertionError(f"{module} has no layer: add it to SUPERTABLE_LAYERS")


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_point_down_the_layers():
    upward = [f"{m} ({LAYER_NAMES[_layer(m)]}) imports {t} ({LAYER_NAMES[_layer(t)]})"
              for m, targets in GRAPH.items() for t in sorted(targets)
              if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_the_indexes_import_no_io():
    for module, targets in GRAPH.items():
        if _layer(module) == INDEX:
            assert all(_layer(t) <= INDEX for t in targets), (module, sorted(targets))


def test_the_storage_layer_knows_no_face_above_it():
    above = ("beam_supertable.iceberg", "beam_supertable.table", "beam_supertable.transforms")
    found = [f"{m} imports {t}" for m, targets in GRAPH.items()
             if m.startswith("beam_supertable.format") for t in sorted(targets)
             if t.startswith(above)]
    assert not found, "\n".join(found)


def test_the_package_top_holds_few_modules_and_no_prefixed_siblings():
    top = sorted(p.stem for p in (ROOT / "beam_supertable").glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top
    # A shared prefix (``_table_*``, ``_write_*``) is a folder waiting to be made.
    prefixed = [n for n in top if re.match(r"_[a-z]+_", n) and not n.startswith("__")]
    assert not prefixed, prefixed


def test_each_folder_says_what_it_holds_and_what_it_may_import():
    for folder in sorted((ROOT / "beam_supertable").iterdir()):
        init = folder / "__init__.py"
        if not init.exists():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 12, f"{folder.name}/__init__.py needs a docstring"
        if folder.name in ("format", "table", "iceberg", "transforms"):
            assert "import" in doc, f"{folder.name}/__init__.py: say what it may import"


def test_beam_upsert_imports_nothing_of_beam_supertable():
    for module, targets in GRAPH.items():
        if module.startswith("beam_upsert"):
            assert not [t for t in targets if not t.startswith("beam_upsert")], module


def _cycles() -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles() == []


def test_the_circle_check_sees_a_circle():
    GRAPH["beam_supertable.errors"].add("beam_supertable.table.supertable")
    try:
        assert any("beam_supertable.errors" in c for c in _cycles())
    finally:
        GRAPH["beam_supertable.errors"].discard("beam_supertable.table.supertable")


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_beam_upsert_loads_no_module_of_beam_supertable():
    out = _fresh("""
        import sys
        import beam_upsert
        print(sorted(m for m in sys.modules if m.split(".")[0] == "beam_supertable"))
        print(beam_upsert.__version__)
    """).splitlines()
    assert out[0] == "[]"
    assert out[1] and out[1] != "0+unknown"


def test_the_table_loads_without_apache_beam():
    out = _fresh("""
        import sys
        from beam_supertable import Supertable
        print(sorted(m for m in sys.modules if m.split(".")[0] == "apache_beam"))
    """)
    assert out.strip() == "[]"


@pytest.mark.slow
def test_every_module_imports_in_a_fresh_interpreter():
    names = [m for m in MODULES if not m.endswith("__main__")]
    out = _fresh(f"""
        import importlib, warnings
        warnings.simplefilter("error", DeprecationWarning)
        for name in {names!r}:
            try:
                importlib.import_module(name)
            except DeprecationWarning as exc:   # only an old path may warn
                if "deprecated" not in str(exc):
                    raise
        print("ok", len({names!r}))
    """)
    assert out.split() == ["ok", str(len(names))]


def test_modules_stay_small_or_say_why():
    long = []
    for module, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > LINE_LIMIT and not module.startswith("pipelines"):
            doc = ast.get_docstring(ast.parse(text)) or ""
            if LONG_REASON not in doc:
                long.append(f"{module}: {text.count(chr(10))} lines")
    assert not long, long
