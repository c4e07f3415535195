"""The tree's shape: imports run one way (app -> chatsvc -> memory, engine; memory -> engine; bench and
tests may import any of them, and nothing imports tests), no import cycle inside the packages, and no
function over 40 lines outside migrations."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "memory", "chatsvc")
MAY_IMPORT = {"engine": set(), "memory": {"engine"}, "chatsvc": {"memory", "engine"}}
MAX_FUNCTION_LINES = 40


def our_files() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*.py")
        if not any(part.startswith(".") or part in ("migrations", "__pycache__") for part in path.parts)
    ]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `path` imports, by their most specific known name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in our_files()}
    known = set(files)
    graph = {module: imported_modules(path, known) - {module} for module, path in files.items()}
    # A package's own __init__ importing its submodules is how packages expose their API, not a cycle.
    return {
        module: {m for m in imports if not module_is_parent(module, m, files)}
        for module, imports in graph.items()
    }


def module_is_parent(module: str, imported: str, files: dict[str, Path]) -> bool:
    return files[module].name == "__init__.py" and imported.startswith(module + ".")


def cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    path, on_path, done = [], set(), set()

    def visit(module: str) -> list[str] | None:
        if module in on_path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        on_path.add(module)
        for imported in sorted(graph.get(module, ())):
            if found := visit(imported):
                return found
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    return visit(start)


def allowed(importer: str, imported: str) -> bool:
    top, target = importer.split(".")[0], imported.split(".")[0]
    if target == "tests":
        return top == "tests"
    if target == "app":
        return top in ("tests", "bench")
    return top not in MAY_IMPORT or target not in PACKAGES or target == top or target in MAY_IMPORT[top]


def test_imports_run_one_way():
    graph = import_graph()
    wrong = [f"{module} imports {imported}" for module in graph for imported in graph[module]]
    assert [line for line in wrong if not allowed(*line.split(" imports "))] == []


def test_no_import_cycle_inside_the_packages():
    graph = {module: imports for module, imports in import_graph().items() if module.startswith(PACKAGES)}
    cycles = {tuple(cycle) for module in graph if (cycle := cycle_from(module, graph))}
    assert cycles == set()


def test_no_function_is_longer_than_forty_lines():
    long = []
    for path in our_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
