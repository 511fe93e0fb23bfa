"""kiln's package layers (docs/architecture.md), checked over the import graph.

Every ``import`` in kiln's sources — module-level and function-local, and ``importlib.import_module``
/ ``__import__`` of a literal name — is read with `ast` and must go to the importing module's own
unit or to a unit of a lower layer. Imports under ``if TYPE_CHECKING:`` are exempt: they never
run, so they cannot form a cycle. A name-computed import of a kiln module is allowed only where
`DYNAMIC_IMPORTS` says why, and no module imports another package's private (``_name``) names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kiln"

#: Layers, lowest first. A module may import its own unit and units of lower layers only.
#: A unit is a package (with everything under it not listed on its own) or a module; the
#: facades ``kiln`` and ``kiln.converter`` stand for their ``__init__`` only.
LAYERS: list[set[str]] = [
    {"kiln.errors", "kiln.schema", "kiln.protos"},     # shared types; protobuf descriptors
    {"kiln.ir", "kiln.rules", "kiln.paths",            # the model representation; the Rule / Decision shape; file checks;
     "kiln.extras"},                                   # the optional extras and the error naming a missing one
    {"kiln.kernels"},                                  # LiteRT's integer and hybrid arithmetic, pure functions
    {"kiln.ops"},                                      # op records: options, shapes, versions, kernels
    {"kiln.format", "kiln.passes", "kiln.fusion"},     # .tflite <-> IR; IR rewrites; composite fusion
    {"kiln.runtime"},                                  # the interpreter
    {"kiln.delegates", "kiln.quant", "kiln.xla"},      # delegates; post-training quantization (calibrates
                                                       # with the interpreter); the XLA backend
    # the converter, bottom up
    {"kiln.converter.tfutil", "kiln.converter.runtime_version", "kiln.converter.attributes"},
    {"kiln.converter.values", "kiln.converter.custom", "kiln.converter.metadata", "kiln.converter.report"},
    {"kiln.converter.options", "kiln.converter.context", "kiln.converter.scope"},
    {"kiln.converter.legalize", "kiln.converter.keras"},   # emitters and recognisers
    {"kiln.support_matrix"},                           # the per-op support matrix, from every backend's table
                                                       # and the emitters (converter coverage)
    {"kiln.converter.importer", "kiln.converter.variables"},
    {"kiln.converter.pipeline"},                       # assembles the tables and the stages
    {"kiln.converter.api"},
    {"kiln.converter", "kiln.converter.cli", "kiln.inference",  # kiln.inference: SavedModel -> SavedModel
     "kiln.beam"},                                     # kiln.beam: RunInference handler
    {"kiln.serve"},                                    # TF Serving's REST API over the runtimes
    # the public facade and the command line
    {"kiln"},
    {"kiln.cli_checks"},                              # what the command checks before it runs anything
    {"kiln.cli", "kiln.demo"},
    {"kiln.__main__"},
]
FACADES = {"kiln", "kiln.converter"}
#: Modules that import kiln modules by a computed name, and why that cannot go upward.
DYNAMIC_IMPORTS = {
    "kiln": "PEP 562 lazy public names (_LAZY, _SUBPACKAGES): modules below the facade",
    "kiln.fusion": "its own modules, named in its _LAZY table",
}
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def unit_of(module: str) -> str:
    """The table's unit for ``module`` (the longest matching name)."""
    best = None
    for unit in RANK:
        if module == unit or (unit not in FACADES and module.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    if best is None:
        raise AssertionError(f"{module} belongs to no unit of the layer table in tests/test_layers.py")
    return best


def _type_checking_only(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _import_call(node: ast.AST):
    """The argument of ``importlib.import_module(...)`` / ``__import__(...)``, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return node.args[0] if name in ("import_module", "__import__") else None


def import_statements(module: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, imported kiln module, names taken from it) for every import in ``module``'s
    source; ``names`` is empty where a whole module is imported."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == "kiln"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "kiln":
                continue
            for alias in node.names:  # "from . import ops" imports the module kiln.ops
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub, ()) if sub in MODULES else (node.lineno, target, (alias.name,)))
        else:
            arg = _import_call(node)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.split(".")[0] == "kiln":
                found.append((node.lineno, arg.value, ()))
    return found


def imports_of(module: str) -> list[tuple[int, str]]:
    """(line, imported kiln module) for every import in ``module``'s source, each once."""
    return sorted({(line, target) for line, target, _ in import_statements(module)})


def test_every_module_has_a_layer():
    for module in MODULES:
        unit_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_respect_the_layers(module):
    unit = unit_of(module)
    wrong = []
    for line, target in imports_of(module):
        other = unit_of(target)
        if other != unit and RANK[other] >= RANK[unit]:
            wrong.append(f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {target} "
                         f"({other}, layer {RANK[other]}) from {unit} (layer {RANK[unit]})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module, source, target", [
    ("kiln.fusion.upward", "def f():\n    from ..converter import importer\n", "kiln.converter.importer"),
    ("kiln.runtime.upward", "import importlib\n\ndef f():\n    return importlib.import_module('kiln.xla')\n",
     "kiln.xla"),
], ids=["from-import", "importlib"])
def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch, module, source, target):
    """The checker itself: an upward import (fusion -> converter; runtime -> xla through importlib)
    is reported."""
    fake = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    fake.parent.mkdir(parents=True)
    fake.write_text(source)
    monkeypatch.setitem(MODULES, module, fake)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "kiln")
    with pytest.raises(AssertionError, match=f"imports {target}"):
        test_imports_respect_the_layers(module)


def package_of(module: str) -> str:
    """``kiln.<name>``: the package (or top-level module) a module belongs to."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    """Which of kiln's packages import which, over every import (function-local ones included)."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        source = package_of(module)
        for _, target in imports_of(module):
            other = package_of(target)
            if other != source:
                graph.setdefault(source, set()).add(other)
    return graph


def test_no_package_cycle():
    """The layer table ranks units, some of them modules; this checks whole packages, so a
    package cannot sit both below and above another (as kiln.quant once did around kiln.ops)."""
    graph = package_graph()
    done: set[str] = set()

    def visit(package: str, path: list[str]) -> None:
        if package in path:
            cycle = path[path.index(package):] + [package]
            raise AssertionError("package cycle: " + " -> ".join(cycle))
        if package in done:
            return
        for other in sorted(graph.get(package, ())):
            visit(other, path + [package])
        done.add(package)

    for package in sorted(graph):
        visit(package, [])


def _may_name_kiln(arg: ast.AST) -> bool:
    """Whether a computed module name can be a kiln module (an f-string starting with another
    package's name cannot)."""
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).split(".")[0] == "kiln"
    return not isinstance(arg, ast.Constant)


def test_computed_imports_are_accounted_for():
    """`importlib` cannot hide an upward import: literal names are layer-checked above, and a
    computed name of a kiln module appears only where `DYNAMIC_IMPORTS` says why."""
    unexplained = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            arg = _import_call(node)
            if arg is not None and _may_name_kiln(arg) and module not in DYNAMIC_IMPORTS:
                unexplained.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not unexplained, f"kiln modules imported by a computed name: {unexplained}"


def test_no_private_names_across_packages():
    """A ``_name`` is its package's own business: another package that needs it gets a public
    name (or the code moves to where it is used)."""
    private = []
    for module in MODULES:
        for line, target, names in import_statements(module):
            if package_of(target) == package_of(module):
                continue
            private += [f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {target}.{n}"
                        for n in names if n.startswith("_") and not n.startswith("__")]
    assert not private, "private names imported across packages:\n" + "\n".join(private)
