"""The package's layers (docs/ARCHITECTURE.md, "Layers"): every ``hf2q``
module's imports, read from its source (ast; top-level and function-level
imports alike), must form no cycle and must never reach a higher layer.
A module of a lower layer that needs something from a higher one is a sign
that the thing lives in the wrong place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "hf2q"

#: Lowest first. A module may import its own layer (no cycle) and the layers
#: below; the first matching prefix names its layer (``hf2q.models.x.y`` is
#: in ``hf2q.models``). ``hf2q._core`` is the native extension.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("hf2q._version", "hf2q._env", "hf2q._lazy", "hf2q._frozen", "hf2q._gc", "hf2q._files", "hf2q._core", "hf2q.errors")),
    ("tables", ("hf2q.formats", "hf2q._arrays", "hf2q.reference", "hf2q._progress", "hf2q._configfile")),
    ("device", ("hf2q._cuda", "hf2q.device", "hf2q.ops")),
    ("files", ("hf2q.safetensors", "hf2q.hub")),
    ("loader", ("hf2q.plan", "hf2q.model", "hf2q.loader", "hf2q.prefetch", "hf2q.shard", "hf2q.torch",
                "hf2q.recipes")),
    ("families", ("hf2q.models",)),
    ("testing", ("hf2q.testing",)),
    ("api", ("hf2q", "hf2q.__main__", "hf2q.cli", "hf2q.pairs", "hf2q.dflash", "hf2q.gemma4", "hf2q.qwen35")),
)


def _layer_of(module: str) -> int:
    best = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best[1]:
                best = i, len(p)
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS here and in docs/ARCHITECTURE.md")
    return best[0]


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    out["hf2q._core"] = PKG / "_core.pyi"
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The ``hf2q`` modules ``module`` imports (a ``from x import name`` of a
    submodule counts as importing the submodule, else ``x``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports for type checkers only (``if TYPE_CHECKING:``) never run.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "hf2q" and not target.startswith("hf2q."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name == "hf2q" or a.name.startswith("hf2q."))
    out.discard(module)
    # Importing a submodule imports its packages first; those edges are the
    # package's own business, not a dependency this module chose.
    return {m for m in out if not module.startswith(m + ".")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items() if p.suffix == ".py"}


def test_every_module_has_a_layer() -> None:
    for m in _graph():
        _layer_of(m)


def test_no_module_imports_a_higher_layer() -> None:
    bad = []
    for m, deps in sorted(_graph().items()):
        for d in sorted(deps):
            if _layer_of(d) > _layer_of(m):
                bad.append(f"{m} ({LAYERS[_layer_of(m)][0]}) imports {d} ({LAYERS[_layer_of(d)][0]})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_the_check_finds_what_it_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk itself: a lower module importing a higher one, and a cycle,
    are found (relative imports of every depth resolved)."""
    pkg = tmp_path / "hf2q"
    (pkg / "models" / "fam").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("from .models.fam import thing\n")
    (pkg / "formats.py").write_text("def f():\n    from . import loader\n")
    (pkg / "loader.py").write_text("from .formats import f\nif TYPE_CHECKING:\n    from .models import fam\n")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "fam" / "__init__.py").write_text("from ...errors import x\n")
    (pkg / "_core.pyi").write_text("")
    monkeypatch.setitem(globals(), "PKG", pkg)
    graph = _graph()
    assert graph["hf2q.errors"] == {"hf2q.models.fam"}
    assert graph["hf2q.models.fam"] == {"hf2q.errors"}
    assert graph["hf2q.formats"] == {"hf2q.loader"}
    with pytest.raises(AssertionError, match="hf2q.errors .base. imports hf2q.models.fam"):
        test_no_module_imports_a_higher_layer()
    with pytest.raises(AssertionError, match="hf2q.formats -> hf2q.loader -> hf2q.formats"):
        test_no_import_cycle()
