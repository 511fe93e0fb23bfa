"""Issue #34's measurements of kiln's kernels and backends, re-runnable on any checkout.

    python tools/kernel_metrics.py [KILN_ROOT] [--list]

KILN_ROOT is a checkout (default: this one); only its sources are read (nothing is imported),
so a baseline exported with ``git archive 1e9d4f8 | tar -x -C /tmp/base`` is measured alike.
``--list`` names what each count counted.

Methods (all static, over ``ast`` / ``tokenize`` of kiln/**/*.py):

* CONV_2D implementations: functions (nested ones folded into their top-level function or
  method) whose body computes a filter product over windows — a product (``@``, dot, matmul,
  einsum, dot_general, conv_general_dilated, int_matmul, an exact-product helper) together with
  a window extraction (see below, or a name for one: im2col, windows, taps, cols) — and whose
  name says CONV_2D (``conv`` and not depthwise / transpose / 3d). Adapters: functions of
  kiln/ops that only hand a CONV_2D node to such a function (``_conv*`` without a product).
* Window extractors: functions that cut a window's strided slice themselves — the stride
  arithmetic ``(o - 1) * s + 1`` inside a slice or a ``lax.slice`` call, or an ``as_strided``
  call.
* Fixed-point rescale implementations: modules holding LiteRT's MultiplyByQuantizedMultiplier
  arithmetic (the doubling high multiply's nudge ``1 << 30``, or the int64 variant's 15-bit
  mantissa ``0x7FFF0000``).
* XLA lowerings similar to their NumPy reference: every top-level function of kiln/xla/lower_*.py
  (at least 60 tokens) against every top-level function of kiln/ops and kiln/kernels:
  ``difflib.SequenceMatcher(autojunk=False)`` over ``tokenize`` tokens without comments,
  docstrings and layout, array namespaces (np, jnp, xp, numpy, lax) read as one name; the
  best ratio >= 0.70 counts.
* Import circles: strongly connected components (Tarjan) of the module import graph inside
  kiln/xla and kiln/delegates, every import counted (function-local and TYPE_CHECKING ones
  included).
* Private cross-package imports: ``from kiln.X... import _name`` (or relative) where X is not
  the importer's own package (``kiln.<name>``), each (module, name) once.
* Lines: kiln/**/*.py, as tests/test_sizes.py counts them.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path

PRODUCTS = {"dot", "matmul", "einsum", "dot_general", "conv_general_dilated", "int_matmul", "_int_dot", "_dot",
            "exact_dot", "int_dot", "product", "gemm", "float_dot", "exact_matmul", "_im2col_product"}
WINDOW_NAMES = re.compile(r"im2col|window|taps?\b|cols\b|tap_|_tap|columns")
NAMESPACES = {"np", "jnp", "xp", "numpy", "lax"}


def modules(root: Path) -> dict[str, Path]:
    kiln = root / "kiln"
    out = {}
    for p in sorted(kiln.rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def top_functions(tree: ast.Module):
    """(qualified name, node) of module-level functions and class methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def has_product(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Call) and _called_name(node) in PRODUCTS:
            return True
    return False


def _stride_arith(node: ast.AST) -> bool:
    """``(o - 1) * s`` anywhere under node (a window's reach: ``start + (o - 1) * s + 1``)."""
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) \
                and not any(isinstance(side, ast.Tuple) for side in (n.left, n.right)):
            for side in (n.left, n.right):
                if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Sub) and isinstance(side.right, ast.Constant) \
                        and side.right.value == 1:
                    return True
    return False


def extracts_windows(fn: ast.AST) -> bool:
    """Cuts window slices to read them (a subscript written with ``+=`` is a scatter: not counted)."""
    written = {id(n.target) for n in ast.walk(fn) if isinstance(n, ast.AugAssign)}
    for node in ast.walk(fn):
        if id(node) in written:
            continue
        if isinstance(node, ast.Call) and _called_name(node) == "as_strided":
            return True
        if isinstance(node, ast.Call) and _called_name(node) == "slice" and _stride_arith(node):
            return True
        if isinstance(node, ast.Subscript) and _stride_arith(node.slice):
            return True
    return False


def uses_windows(fn: ast.AST, source: str) -> bool:
    return extracts_windows(fn) or bool(WINDOW_NAMES.search(ast.get_source_segment(source, fn) or ""))


def is_conv2d_name(name: str) -> bool:
    low = name.lower()
    return "conv" in low and not any(k in low for k in ("depthwise", "transpose", "tconv", "3d", "dw"))


def _referenced(fn: ast.AST) -> set[str]:
    """Names a function's body mentions (``f`` and the ``f`` of ``mod.f``)."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def conv2d(mods: dict[str, Path]):
    """(implementations, adapters); a helper only its module's counted functions call is
    folded into them (``_conv_rows`` into ``_conv_kernel``)."""
    found, every = [], []
    for mod, path in mods.items():
        source = path.read_text()
        tree = ast.parse(source)
        functions = list(top_functions(tree))
        every += [(mod, name, fn) for name, fn in functions]
        for name, fn in functions:
            if is_conv2d_name(name) and has_product(fn) and uses_windows(fn, source):
                found.append((mod, name, fn))
    impls = []
    for mod, name, fn in found:
        short = name.split(".")[-1]
        callers = [(m, n) for m, n, f in every if (m, n) != (mod, name) and short in _referenced(f)]
        if callers and all(m == mod and any((m, n) == (fm, fn_) for fm, fn_, _ in found) for m, n in callers):
            continue
        impls.append(f"{mod}.{name}")
    names = {i.rsplit(".", 1)[-1] for i in impls}
    adapters = [f"{m}.{n}" for m, n, f in every if m.startswith("kiln.ops.") and f"{m}.{n}" not in impls
                and _referenced(f) & names]
    return impls, adapters


def window_extractors(mods):
    found = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        found += [f"{mod}.{name}" for name, fn in top_functions(tree) if extracts_windows(fn)]
    return found


def _rescales(fn: ast.AST, source: str) -> bool:
    """LiteRT's doubling high multiply (``1 << 30`` nudge, ``>> 31``) or the int64 variant's
    15-bit mantissa (``0x7FFF0000``)."""
    text = ast.get_source_segment(source, fn) or ""
    return "0x7FFF0000" in text or (bool(re.search(r"1\s*<<\s*30\b", text)) and bool(re.search(r">>\s*31\b|, 31\)", text)))


def rescale_modules(mods):
    """{module: [functions]} holding the rescale arithmetic."""
    out = {}
    for mod, path in mods.items():
        source = path.read_text()
        hits = [name for name, fn in top_functions(ast.parse(source)) if _rescales(fn, source)]
        if hits:
            out[mod] = hits
    return out


def _tokens(src: str) -> list[str]:
    out = []
    prev = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.STRING and prev in (None, ":"):   # docstrings
                prev = "STR"
                continue
            text = tok.string
            if tok.type == tokenize.NAME and text in NAMESPACES:
                text = "XP"
            out.append(text)
            prev = text
    except (tokenize.TokenError, IndentationError):
        pass
    return out


def _function_tokens(path: Path):
    source = path.read_text()
    tree = ast.parse(source)
    for name, fn in top_functions(tree):
        seg = ast.get_source_segment(source, fn)
        if seg:
            lines = seg.splitlines()
            body = "\n".join(lines[1:])   # the body only: the signature is not the arithmetic
            args = fn.args.posonlyargs + fn.args.args
            yield name, _tokens(textwrap.dedent(body)), bool(args) and args[0].arg == "call"


def similar_lowerings(mods, threshold=0.70, minimum=60):
    references = []
    for mod, path in mods.items():
        if mod.startswith(("kiln.ops.", "kiln.kernels.")):
            references += [(f"{mod}.{n}", t) for n, t, _ in _function_tokens(path) if len(t) >= minimum // 2]
    hits = []
    for mod, path in mods.items():
        if not (mod.startswith("kiln.xla.lower_")):
            continue
        for name, toks, is_lowering in _function_tokens(path):
            if len(toks) < minimum or not is_lowering:
                continue
            best, best_ref = 0.0, None
            sm = difflib.SequenceMatcher(autojunk=False)
            sm.set_seq2(toks)
            for ref, rt in references:
                if len(rt) < len(toks) * 0.5 or len(rt) > len(toks) * 2:
                    continue
                sm.set_seq1(rt)
                if sm.real_quick_ratio() < threshold or sm.quick_ratio() < threshold:
                    continue
                r = sm.ratio()
                if r > best:
                    best, best_ref = r, ref
            if best >= threshold:
                hits.append(f"{mod}.{name} ~ {best_ref} ({best:.2f})")
    return hits


def _imports(mod: str, path: Path, mods) -> list[tuple[str, list[str]]]:
    """(target module, imported names) for every import statement of ``mod``."""
    tree = ast.parse(path.read_text())
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("kiln")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("kiln"):
                continue
            names = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in mods:
                    out.append((sub, []))
                else:
                    names.append(alias.name)
            if names:
                out.append((target, names))
        elif isinstance(node, ast.Call) and _called_name(node) in ("import_module", "__import__") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append((node.args[0].value, []))
    return out


def circles(mods, package: str):
    graph = {m: set() for m in mods if m == package or m.startswith(package + ".")}
    for m in graph:
        for target, _ in _imports(m, mods[m], mods):
            if target in graph and target != m:
                graph[m].add(target)
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sccs


def private_imports(mods):
    found = []
    for mod, path in mods.items():
        own = ".".join(mod.split(".")[:2])
        for target, names in _imports(mod, path, mods):
            other = ".".join(target.split(".")[:2])
            if other == own:
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    found.append(f"{mod} <- {target}.{name}")
    return sorted(set(found))


def lines(mods) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in mods.values())


def main(argv: list[str]) -> None:
    show = "--list" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = Path(args[0] if args else Path(__file__).resolve().parents[1]).resolve()
    mods = modules(root)
    impls, adapters = conv2d(mods)
    windows = window_extractors(mods)
    rescales = rescale_modules(mods)
    similar = similar_lowerings(mods)
    cyc = {p: circles(mods, p) for p in ("kiln.xla", "kiln.delegates")}
    private = private_imports(mods)
    print(f"checkout: {root}")
    print(f"CONV_2D implementations: {len(impls)} (+ {len(adapters)} adapters)")
    print(f"window extractors: {len(windows)}")
    print(f"fixed-point rescale implementations (modules): {len(rescales)}")
    print(f"XLA lowerings >= 70% token-similar to a NumPy reference: {len(similar)}")
    for p, sccs in cyc.items():
        print(f"import circles in {p}: {[len(c) for c in sccs] or 'none'}")
    print(f"private names imported across packages: {len(private)}")
    print(f"kiln/ lines: {lines(mods)}")
    if show:
        rescale_list = [f"{m}: {', '.join(f)}" for m, f in rescales.items()]
        for title, items in (("CONV_2D implementations", impls), ("adapters", adapters), ("window extractors", windows),
                             ("rescale modules", rescale_list), ("similar lowerings", similar),
                             ("private imports", private)):
            print(f"\n{title}:")
            for item in items:
                print(f"  {item}")
        for p, sccs in cyc.items():
            for c in sccs:
                print(f"\ncircle in {p} ({len(c)}): {', '.join(c)}")


if __name__ == "__main__":
    main(sys.argv[1:])
