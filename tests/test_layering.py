"""The layers' import rules, checked on the code and on a fresh interpreter: serving (`inference`,
`service`) imports nothing from `training`, at module level or inside a function; the engine
protocol (`inference.engine`) imports no engine implementation; `research` (the studies'
workbenches) may import every layer, and nothing but its own tests imports it. The core
(`medtpe_core`) imports no layer above it (nor torch or vLLM) and has no import circle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SERVING = ("inference", "service")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in the file (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", SERVING)
def test_serving_code_never_imports_training(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "training"
        )
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_only_research_and_its_tests_import_research() -> None:
    research_tests = ROOT / "tests" / "research"
    packages = [p for p in sorted(ROOT.iterdir()) if (p / "__init__.py").is_file()]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "research"
        )
        for package in packages
        if package.name != "research"
        for path in sorted(package.rglob("*.py"))
        if not path.is_relative_to(research_tests)
    }
    assert "research" in {p.name for p in packages}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_engine_protocol_imports_no_implementation() -> None:
    imports = imported_modules(ROOT / "inference" / "engine.py")
    assert {name for name in imports if name.startswith(("inference.", "vllm"))} == set()


def loaded_after(modules: list[str]) -> set[str]:
    """The top-level packages in `sys.modules` of a fresh interpreter that imported `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
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
            "service.app",
            "service.api_processes",
            "inference.model",
            "inference.predictor",
            "inference.engine_factories",
            "inference.instant_engine",
            "inference.vllm_engine",
            "medtpe_cli.service_commands",
        ]
    )
    assert {"inference", "service", "vllm"} <= loaded
    assert "training" not in loaded


def test_the_engine_protocol_and_the_fake_engine_load_without_vllm() -> None:
    loaded = loaded_after(
        ["inference.engine", "inference.engine_factories", "inference.instant_engine"]
    )
    assert "vllm" not in loaded and "training" not in loaded


BATCH_IMPORTS = {"medtpe_core", "inference", "ledger"}
"""The project's packages `batch` may import."""


def test_the_batch_layer_sits_between_the_library_and_the_command_line() -> None:
    """`batch` (the population job) may import `medtpe_core`, `inference` and `ledger`, not
    `evaluation`, `service`, `training` nor the CLI; of the project's packages only `medtpe_cli`
    imports it."""
    project = {
        "medtpe_core",
        "inference",
        "evaluation",
        "ledger",
        "service",
        "training",
        "medtpe_cli",
    }
    below = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] in project - BATCH_IMPORTS
        )
        for path in sorted((ROOT / "batch").rglob("*.py"))
    }
    assert {path: names for path, names in below.items() if names} == {}
    above = {
        str(path.relative_to(ROOT))
        for package in project - {"medtpe_cli"}
        for path in sorted((ROOT / package).rglob("*.py"))
        if any(name.split(".")[0] == "batch" for name in imported_modules(path))
    }
    assert above == set()


LEDGER_IMPORTS = {"ledger", "medtpe_core", "sqlalchemy", "alembic", "cryptography"}
"""What `ledger` may import besides the standard library."""


def test_the_ledger_imports_the_core_and_its_database_and_crypto_libraries_only() -> None:
    """`ledger` (the prediction ledger, the model card) is written to by the service, the
    batch job and the command line, and imports none of them, nor the engine; only those
    layers import it."""
    outside = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(path)
            if name.split(".")[0] not in LEDGER_IMPORTS | sys.stdlib_module_names
        )
        for path in sorted((ROOT / "ledger").rglob("*.py"))
    }
    assert {path: names for path, names in outside.items() if names} == {}
    below = {
        str(path.relative_to(ROOT))
        for package in ("medtpe_core", "inference", "training", "evaluation")
        for path in sorted((ROOT / package).rglob("*.py"))
        if any(name.split(".")[0] == "ledger" for name in imported_modules(path))
    }
    assert below == set()


MONITORING_IMPORTS = {"monitoring", "ledger", "medtpe_core"}
"""The project's packages `monitoring` may import."""
PROJECT = {
    "medtpe_core", "inference", "evaluation", "ledger", "service", "training", "batch",
    "medtpe_cli", "monitoring", "research", "benchmarks",
}  # fmt: skip


def test_monitoring_reads_the_ledger_and_the_core_only() -> None:
    """`monitoring` (outcomes joined to the ledger, the report) imports the ledger and the
    core, never the engine, the service, the batch job nor torch; of the layers only the command
    line imports it."""
    outside = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(path)
            if name.split(".")[0] in (PROJECT - MONITORING_IMPORTS) | {"torch", "vllm"}
        )
        for path in sorted((ROOT / "monitoring").rglob("*.py"))
    }
    assert {path: names for path, names in outside.items() if names} == {}
    importers = {
        str(path.relative_to(ROOT))
        for package in PROJECT - {"monitoring", "medtpe_cli", "benchmarks", "research"}
        for path in sorted((ROOT / package).rglob("*.py"))
        if any(name.split(".")[0] == "monitoring" for name in imported_modules(path))
    }
    assert importers == set()


CORE = "medtpe_core"
ABOVE_THE_CORE = (
    "training",
    "inference",
    "service",
    "evaluation",
    "batch",
    "ledger",
    "monitoring",
    "medtpe_cli",
    "research",
    "benchmarks",
    "torch",
    "vllm",
)


def test_the_core_imports_no_layer_above_it() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] in ABOVE_THE_CORE
        )
        for path in sorted((ROOT / CORE).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def core_graph() -> dict[str, set[str]]:
    """Each core module and the core modules its file imports, lazily or not (a package's
    `__init__` under the package's name; `from a import b` imports `a.b` where that is a module,
    else `a`)."""
    files = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / CORE).rglob("*.py")
    }
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
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
