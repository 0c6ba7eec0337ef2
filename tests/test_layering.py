"""The packages are layered as the pipeline: an import may point down or sideways, never
up, and no imports form a cycle, counting those inside functions. No exceptions are
listed here."""
import ast
from pathlib import Path

import ratrain

# lower numbers sit lower; a module may import its own layer and those below it
LAYERS = {"units": 0, "settings": 0, "atomic": 0, "errors": 0, "kernels": 0, "optim": 0,
          "ir": 1, "program_format": 2, "ops": 3, "models": 3, "data": 3, "hw": 3, "inputs": 3,
          "passes": 4, "codegen": 5, "rt": 6, "compiler": 7, "programs": 7,
          "sim": 7, "planner": 8, "calibrate": 8, "cluster": 8, "cli": 9}
ROOT = Path(ratrain.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int | None:
    top = module.split(".")[1]
    return LAYERS.get("cli" if top.startswith("cli") else top)


def _from_names(node: ast.ImportFrom) -> list[str]:
    """`from M import a`: M.a where that is a module (a submodule import does not depend on
    what M's __init__ defines), else M."""
    return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
            for a in node.names]


def _imports(path: Path):
    """(imported ratrain module, inside a function?) of every import in the file."""
    def walk(node, inside):
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                _from_names(child) if isinstance(child, ast.ImportFrom) and child.level == 0 \
                else []
            for name in names:
                while name and name not in MODULES:
                    name = name.rpartition(".")[0]
                if name and name != "ratrain":
                    yield name, nested
            yield from walk(child, nested)
    yield from walk(ast.parse(path.read_text()), False)


IMPORTS = {m: set(_imports(p)) for m, p in MODULES.items() if m != "ratrain"}


def test_every_module_has_a_layer():
    assert {m for m in IMPORTS if _layer(m) is None} == set()


def test_no_import_points_up_the_pipeline():
    up = sorted((m, t) for m, ts in IMPORTS.items() for t, _ in ts
                if (_layer(t) or 0) > (_layer(m) or 0))
    assert up == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's,
    iterative), each sorted: every import cycle lies inside one."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def test_no_import_cycle_even_through_imports_inside_functions():
    """Every import counts, the lazy ones (inside a function, for JAX or matplotlib) too:
    a lazy import that closes a cycle only hides it from Python, not from the reader."""
    graph = {m: {t for t, _ in ts if t != m} for m, ts in IMPORTS.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
