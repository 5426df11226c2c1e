"""The `medtpe` group: every command module imports with the core dependencies alone (never
skipped), a command missing an optional extra's module names the extra, any other import error
is raised as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from medtpe.cli.main import MedtpeGroup, add_commands, cli, optional_modules


def run_without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter where importing any of `modules` fails as if it were not
    installed (`sys.modules[name] = None`)."""
    block = f"import sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", block + code], capture_output=True, text=True, timeout=300
    )


def test_optional_modules_are_read_from_the_package_extras() -> None:
    modules = optional_modules()
    assert modules["torch"] == ["cpu", "train"]
    assert modules["vllm"] == ["cpu", "gpu"]
    assert modules["aces"] == ["labels"]
    assert modules["pydantic_settings"] == ["service"]
    assert "numpy" not in modules and "pytest" not in modules  # core and dev


def test_every_command_loads_without_any_optional_extra() -> None:
    out = run_without(
        sorted(optional_modules()),
        "from medtpe.cli.main import cli\nprint(' '.join(sorted(cli.commands)))",
    )
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == set(cli.commands)
    assert {"serve", "tokenize", "ssft", "evaluate"} <= set(cli.commands)


def test_a_command_missing_an_extra_names_the_extra(tmp_path: Path) -> None:
    code = (
        "from medtpe.cli.main import main\n"
        f"sys.argv = ['medtpe', 'prepare-model', '--out', {str(tmp_path / 'model')!r}]\n"
        "main()"
    )
    out = run_without(["torch"], code)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "`medtpe prepare-model` needs the module `torch`" in out.stderr
    assert "`cpu` or `train`" in out.stderr and "pip install 'medtpe[cpu]'" in out.stderr


def test_other_import_errors_are_raised() -> None:
    @click.command("broken")
    def broken() -> None:
        import medtpe.core.no_such_module  # noqa: F401

    group = MedtpeGroup()
    group.add_command(broken)
    result = CliRunner().invoke(group, ["broken"])
    assert isinstance(result.exception, ModuleNotFoundError)
    assert result.exception.name == "medtpe.core.no_such_module"


def test_a_command_module_that_fails_to_import_is_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModuleNotFoundError, match=r"medtpe\.cli\.no_such_commands"):
        add_commands(click.Group(), ("medtpe.cli.no_such_commands",))
    (tmp_path / "broken_commands.py").write_text("import no_such_dependency\ncommands = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        add_commands(click.Group(), ("broken_commands",))
