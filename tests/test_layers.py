"""The packages form layers, each importing only from the layers below it (README, "How the
pieces fit"): a newcomer can read the code bottom up, and the sans-IO core can be reused
without the service. Every import counts, including those under ``TYPE_CHECKING`` and inside
functions, since a cycle hidden from the interpreter is still one for the reader."""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Lowest first. A package may import its own modules and those of any lower layer; packages of
#: one layer are peers and import nothing from each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"protocol"}),
    frozenset({"statemachine"}),
    frozenset({"transport"}),
    frozenset({"store"}),
    frozenset({"coordinator", "consumer"}),
    frozenset({"broker", "pipeline"}),
    frozenset({"simulation"}),
    frozenset({"cli"}),
    frozenset({"launch"}),
    frozenset({"bench", "examples"}),
    frozenset({"tests"}),
    frozenset({"scripts"}),
)
LAYER = {package: index for index, layer in enumerate(LAYERS) for package in layer}
#: The one module that may import kazoo: the store's bridge between kazoo's threads and trio.
KAZOO_BRIDGE = "store/kazoo_bridge.py"


def _modules() -> Iterator[tuple[str, Path]]:
    for package in LAYER:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level name) of every absolute import in the module."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def test_every_package_is_in_a_layer() -> None:
    packages = {
        path.name
        for path in ROOT.iterdir()
        if path.is_dir() and any(path.glob("*.py")) and not path.name.startswith(".")
    }
    assert packages == set(LAYER)


def test_packages_import_only_from_lower_layers() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package, path in _modules()
        for line, name in _imports(path)
        if name in LAYER and name != package and LAYER[name] >= LAYER[package]
    ]
    assert not wrong, "\n".join(wrong)


def _private_imports(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, top-level package, name) of every name starting with ``_`` that the module takes
    from an absolute ``from X import _y``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name.startswith("_"):
                    yield node.lineno, node.module.split(".")[0], alias.name


def test_only_the_kazoo_bridge_imports_kazoo() -> None:
    """The store's other modules and the benchmarks reach kazoo through the bridge, so that one
    module decides how kazoo's threads meet trio."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for package, path in _modules()
        if package != "tests" and path.relative_to(ROOT).as_posix() != KAZOO_BRIDGE
        for line, name in _imports(path)
        if name == "kazoo"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_package_imports_private_names_of_another() -> None:
    """A name starting with ``_`` is its package's own business; another package (a benchmark,
    an example) that needs it asks for a public name. Tests may look inside what they test."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {source}"
        for package, path in _modules()
        if package != "tests"
        for line, source, name in _private_imports(path)
        if source in LAYER and source != package
    ]
    assert not wrong, "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, ``from package import module`` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in modules:
                found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in modules
            )
    return found


def test_no_module_cycles_within_a_package() -> None:
    """A package's modules form a DAG too, so each can be read after those it uses. A package's
    ``__init__`` re-exports its modules and is left out: importing a sibling through it is still
    an edge to that sibling, which is what a cycle is made of."""
    paths = {_module_name(path): path for _, path in _modules()}
    modules = set(paths)
    graph = {
        name: {
            other
            for other in _module_imports(paths[name], modules)
            if other != name and paths[other].name != "__init__.py"
        }
        for name in modules
        if paths[name].name != "__init__.py"
    }
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph.get(name, ())):
            if state.get(other) == 1:
                cycles.append(" -> ".join([*path[path.index(other) :], other]))
            elif other not in state:
                visit(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


#: The most lines a module of the product may have: past it, a module holds more than one concern
#: and a reader cannot hold it in mind (issue 32).
MODULE_LINES = 900


def test_no_product_module_is_over_the_limit() -> None:
    over = {
        path.relative_to(ROOT).as_posix()
        for package, path in _modules()
        if package != "tests" and len(path.read_text().splitlines()) > MODULE_LINES
    }
    assert not over, sorted(over)
