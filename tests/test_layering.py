"""The layers' import rules, checked on the code and on a fresh interpreter.

Everything that ships is one import root, `medtpe`; its subpackages are layers, each allowed to
import only the ones below it (`ALLOWED`, a module-level or lazy import alike): the core at the
bottom (no torch, no vLLM, no import circle), then the engine (`inference`), the ledger and the
model card, the FHIR resources written back, the evaluation, then the four siblings that never
import each other (`service`, `batch`, `monitoring`, `training`), and the command line above
all. Each package states its public surface (a docstring and `__all__`: its public submodules
and the names its `__init__` offers; a module's `__all__`: the names it offers), and a layer
imports another only through that surface. The engine protocol imports no engine
implementation; no module imports another module's private name; the tools (`tools/`:
benchmarks, research, scripts) may import every layer, and nothing outside `tools/` and
`tests/tools/` imports them.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "medtpe"
CORE = {"core"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "inference": CORE,
    "ledger": CORE,
    "model_card": CORE,
    "fhir_resources": CORE | {"model_card"},
    "evaluation": CORE | {"inference"},
    "service": CORE | {"inference", "ledger", "model_card", "fhir_resources"},
    "batch": CORE | {"inference", "ledger", "model_card", "fhir_resources"},
    "monitoring": CORE | {"ledger"},
    "training": CORE | {"inference", "evaluation"},
    "cli": CORE
    | {"inference", "ledger", "model_card", "fhir_resources", "evaluation"}
    | {"service", "batch", "monitoring", "training"},
}
"""Each layer of `medtpe` and the layers it may import (its own modules always)."""
SIBLINGS = ("service", "batch", "monitoring", "training")


def imports_of(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of `path`, anywhere in the file (lazy imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports (absolute imports; the project uses no relative ones)."""
    names = set()
    for node in imports_of(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif node.module and not node.level:
            names.add(node.module)
    return names


def layer_of(path: Path) -> str:
    """The layer a module of `medtpe` belongs to (its first folder under `medtpe/`)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ""


def test_every_layer_is_declared() -> None:
    layers = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert layers == set(ALLOWED)
    assert all(set(ALLOWED[layer]) <= set(ALLOWED) for layer in ALLOWED)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        allowed = {*ALLOWED.get(layer, set()), layer}
        bad = sorted(
            name
            for name in imported_modules(path)
            if name.split(".")[0] == "medtpe"
            and len(name.split(".")) > 1
            and name.split(".")[1] not in allowed
        )
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_the_siblings_are_independent() -> None:
    for one in SIBLINGS:
        assert not (set(SIBLINGS) - {one}) & ALLOWED[one], one


def test_the_layers_have_no_circle() -> None:
    done: set[str] = set()

    def visit(layer: str, path: tuple[str, ...]) -> None:
        assert layer not in path, [*path, layer]
        if layer not in done:
            for below in ALLOWED[layer]:
                visit(below, (*path, layer))
            done.add(layer)

    for layer in ALLOWED:
        visit(layer, ())


def test_no_module_imports_a_private_name_of_another() -> None:
    offenders = []
    for folder in ("medtpe", "tools", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in imports_of(path):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.module.split(".")[0] != "medtpe":
                    continue
                private = [a.name for a in node.names if a.name.startswith("_")]
                private = [name for name in private if not name.startswith("__")]
                if private:
                    offenders.append(f"{path.relative_to(ROOT)}: {node.module} {private}")
    assert offenders == []


def test_the_product_imports_no_tool_and_no_test() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] in {"tools", "tests"}
        )
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def module_file(name: str) -> Path | None:
    """The file of the module or package `name` (dotted, from the root), None when there is none."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree (each file read once per run)."""
    return ast.parse(path.read_text(), str(path))


def declared_all(path: Path) -> list[str] | None:
    """The names of `path`'s top-level `__all__` (a literal list), None when it declares none."""
    for node in parsed(path).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
                return list(ast.literal_eval(node.value))
    return None


def top_level_names(path: Path) -> set[str]:
    """The names `path` binds at module level (inside `if` and `try` blocks too), and for a
    package its submodules."""
    names: set[str] = set()
    statements = list(parsed(path).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If | ast.Try):
            statements.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            statements.extend(s for handler in getattr(node, "handlers", []) for s in handler.body)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    if path.name == "__init__.py":
        names.update(p.stem for p in path.parent.glob("*.py") if p.name != "__init__.py")
        names.update(p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file())
    return names


def packages_of(folder: Path) -> list[Path]:
    """Every package's `__init__.py` under `folder` (itself included)."""
    return sorted(folder.rglob("__init__.py"))


def states_what_it_holds(path: Path) -> bool:
    """Whether `path` opens with a docstring (a placeholder "TODO" is none)."""
    text = ast.get_docstring(parsed(path)) or ""
    return bool(text) and not text.startswith("TODO")


def test_every_package_states_what_it_holds_and_its_public_surface() -> None:
    tool_packages = [ROOT / "tools" / "__init__.py", ROOT / "tests" / "tools" / "__init__.py"]
    undocumented = [
        str(path.relative_to(ROOT))
        for path in [*packages_of(PACKAGE), *tool_packages]
        if not states_what_it_holds(path)
    ]
    assert undocumented == []
    without_all = [
        str(path.relative_to(ROOT)) for path in packages_of(PACKAGE) if declared_all(path) is None
    ]
    assert without_all == []


def test_every_name_in_an_all_exists() -> None:
    stale = {
        str(path.relative_to(ROOT)): missing
        for path in sorted(PACKAGE.rglob("*.py"))
        if (missing := sorted(set(declared_all(path) or []) - top_level_names(path)))
    }
    assert stale == {}


def medtpe_imports(path: Path) -> list[tuple[str, list[str]]]:
    """Each module of `medtpe` that `path` imports, with the names it takes from it (none for
    `import medtpe.x.y`)."""
    found = []
    for node in imports_of(path):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif node.module and not node.level:
            found.append((node.module, [alias.name for alias in node.names]))
    return [(module, names) for module, names in found if module.split(".")[0] == "medtpe"]


def public(package: str) -> list[str]:
    """What the package `package` lists in its `__all__` (nothing when it declares none)."""
    init = module_file(package)
    return (declared_all(init) or []) if init is not None else []


def surface_problems(importer: Path, module: str, names: list[str]) -> list[str]:
    """Why `importer` importing `names` from `module` (no names: `import module`) reaches past a
    public surface: each package on the module's path that does not hold `importer` must list
    the next part of the path in its `__all__`, and the module itself (a package, or a module
    that declares `__all__`) each name, unless it lies in `importer`'s own package."""
    parts, inside = module.split("."), importer.relative_to(ROOT).parent.parts
    path = module_file(module)
    if path is None:
        return [f"{module} is no module"]
    problems = [
        f"{'.'.join(parts[: depth + 1])} is not in {'.'.join(parts[:depth])}.__all__"
        for depth in range(1, len(parts))
        if tuple(parts[:depth]) != inside[:depth]
        and parts[depth] not in public(".".join(parts[:depth]))
    ]
    holder = tuple(parts if path.name == "__init__.py" else parts[:-1])
    offered = declared_all(path)
    if holder != inside[: len(holder)] and (offered is not None or path.name == "__init__.py"):
        problems.extend(
            f"{module}.{name} is not in {module}.__all__"
            for name in names
            if name not in (offered or [])
        )
    return problems


def test_imports_from_another_package_go_through_its_public_surface() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        problems = {
            problem
            for module, names in medtpe_imports(path)
            for problem in surface_problems(path, module, names)
        }
        if problems:
            offenders[str(path.relative_to(ROOT))] = sorted(problems)
    assert offenders == {}


def test_nothing_outside_the_tools_imports_them() -> None:
    tools, tools_tests = ROOT / "tools", ROOT / "tests" / "tools"
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "tools"
        )
        for folder in ROOT.iterdir()
        if folder.is_dir() and not folder.name.startswith(".") and folder != tools
        for path in sorted(folder.rglob("*.py"))
        if not path.is_relative_to(tools_tests)
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_engine_protocol_imports_no_implementation() -> None:
    imports = imported_modules(PACKAGE / "inference" / "engines" / "protocol.py")
    assert {name for name in imports if name.startswith(("medtpe.inference", "vllm"))} == set()


THIRD_PARTY_BELOW: dict[str, set[str]] = {
    "core": {"torch", "vllm", "transformers", "fastapi", "sqlalchemy"},
    "ledger": {"torch", "vllm", "transformers", "fastapi"},
    "monitoring": {"torch", "vllm", "transformers", "fastapi"},
    "model_card": {"torch", "vllm", "transformers", "fastapi", "sqlalchemy"},
    "fhir_resources": {"torch", "vllm", "transformers", "fastapi", "sqlalchemy"},
}
"""Libraries a layer must not import: the core stays free of torch and of every server."""


@pytest.mark.parametrize("layer", sorted(THIRD_PARTY_BELOW))
def test_the_lower_layers_import_no_heavy_library(layer: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(path)
            if name.split(".")[0] in THIRD_PARTY_BELOW[layer]
        )
        for path in sorted((PACKAGE / layer).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def loaded_after(modules: list[str]) -> set[str]:
    """The `medtpe` layers and top-level packages in `sys.modules` of a fresh interpreter that
    imported `modules` (a layer as `medtpe.<layer>`)."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({'.'.join(m.split('.')[:2]) if m.startswith('medtpe.') "
        "else m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_importing_inference_and_service_leaves_training_out() -> None:
    pytest.importorskip("vllm")
    loaded = loaded_after(
        [
            "medtpe.service.app",
            "medtpe.service.api_processes",
            "medtpe.inference.model",
            "medtpe.inference.predictor",
            "medtpe.inference.engines.factories",
            "medtpe.inference.engines.instant",
            "medtpe.inference.engines.vllm_engine",
            "medtpe.cli.service_commands",
        ]
    )
    assert {"medtpe.inference", "medtpe.service", "vllm"} <= loaded
    assert "medtpe.training" not in loaded and "torch" in loaded


def test_the_engine_protocol_and_the_fake_engine_load_without_vllm() -> None:
    loaded = loaded_after(
        [
            "medtpe.inference.engines.protocol",
            "medtpe.inference.engines.factories",
            "medtpe.inference.engines.instant",
        ]
    )
    assert "vllm" not in loaded and "medtpe.training" not in loaded


def core_graph() -> dict[str, set[str]]:
    """Each core module and the core modules its file imports, lazily or not (a package's
    `__init__` under the package's name; `from a import b` imports `a.b` where that is a module,
    else `a`)."""
    files = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (PACKAGE / "core").rglob("*.py")
    }
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in imports_of(path):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in files else node.module)
        graph[name] = (targets & files.keys()) - {name}
    return graph


def test_the_core_has_no_import_circle() -> None:
    graph = core_graph()
    finished: set[str] = set()

    def circle(name: str, path: list[str]) -> list[str]:
        """A circle through `name` reached by `path` ([] when none)."""
        if name in path:
            return [*path[path.index(name) :], name]
        if name in finished:
            return []
        for target in sorted(graph[name]):
            if found := circle(target, [*path, name]):
                return found
        finished.add(name)
        return []

    assert [found for name in sorted(graph) if (found := circle(name, []))] == []
