"""The package's layout rules, read from the source with ``ast`` (nothing is imported):

* no source file of the package is longer than 600 lines;
* no import cycle anywhere in the package, lazy imports inside functions included (``if
  TYPE_CHECKING:`` imports are for annotations only and do not count);
* no module of the package imports another module's underscore name;
* every module of the package opens with a docstring (its one job);
* no Triton kernel gives a ``tl.constexpr`` parameter a default: a kernel that torch.compile
  traces is launched by Inductor's own launcher, which expects every parameter the kernel
  declares, and a default left out of a launch made it fail (``missing 1 required positional
  argument``) where eager launches and the interpreter ran.

The first and last are checked module by module, so that a failure names the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "triton_workshop"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(name: str) -> list[tuple[str, str, int]]:
    """(module imported, name taken from it or "", line) for every import of the package's own
    modules in ``name``: ``from .a import b`` is an edge to ``a.b`` when that is a module."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.append((f"{target}.{alias.name}", "", node.lineno))
                elif target in MODULES:
                    found.append((target, alias.name, node.lineno))
    return found


@pytest.mark.parametrize("name", list(MODULES))
def test_no_module_is_over_the_limit(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, (f"{MODULES[name].relative_to(ROOT)}: {lines} lines, over "
                                f"{MAX_LINES}: split it along its seams")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_package():
    graph = {name: {target for target, _, _ in imports(name) if target != name} for name in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_underscore_names_of_other_modules():
    """The whole package: what crosses a module has a public name."""
    found = [f"{MODULES[name].relative_to(ROOT)}:{line} imports {taken} from {target}"
             for name in MODULES
             for target, taken, line in imports(name)
             if taken.startswith("_") and not taken.startswith("__") and target != name]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", list(MODULES))
def test_each_module_says_its_job(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc.split()) >= 5, f"{name}: no opening docstring saying its job"


def _jit_kernels(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list):
            yield node


@pytest.mark.parametrize("name", [n for n, p in MODULES.items() if "triton" in p.read_text()])
def test_no_kernel_parameter_has_a_default(name):
    path = MODULES[name]
    for kernel in _jit_kernels(ast.parse(path.read_text(), str(path))):
        args = kernel.args
        with_defaults = [*args.posonlyargs, *args.args][len(args.posonlyargs) + len(args.args)
                                                        - len(args.defaults):]
        with_defaults += [a for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        named = [a.arg for a in with_defaults
                 if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)]
        assert not named, (f"{path.relative_to(ROOT.parent)}: {kernel.name} gives constexpr "
                           f"{named} a default; pass it at every launch instead")
