"""The packages are layered as the pipeline: an import may point down or sideways, never
up, and no import inside a function dodges a cycle. No exceptions are listed here."""
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


def _imports(path: Path):
    """(imported ratrain module, inside a function?) of every import in the file."""
    def walk(node, inside):
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                [child.module, *(f"{child.module}.{a.name}" for a in child.names)] \
                if isinstance(child, ast.ImportFrom) and child.level == 0 else []
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


def test_no_import_inside_a_function_dodges_a_cycle():
    """An import inside a function is for laziness (JAX, matplotlib), never because the
    imported module imports this one back at module level."""
    top = {m: {t for t, inside in ts if not inside} for m, ts in IMPORTS.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            m = stack.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                stack += top.get(m, ())
        return False
    dodges = sorted((m, t) for m, ts in IMPORTS.items() for t, inside in ts
                    if inside and t != m and reaches(t, m))
    assert dodges == []
