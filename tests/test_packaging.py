"""What the wheel installs: one top-level import package, `medtpe`, with its data files, and the
entry points naming modules inside it; the repository root shows the product at a glance."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

MAX_TOP_LEVEL_FOLDERS = 10


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The project's wheel, built from a copy of what the build reads (pyproject.toml, the
    README, `medtpe/`: setuptools writes its build folders beside the sources), with no
    dependencies and no build isolation: the environment's setuptools, offline."""
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "medtpe", source / "medtpe", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True, capture_output=True, timeout=300, env={**os.environ, "TMPDIR": str(build)},
    )  # fmt: skip
    (path,) = out.glob("medtpe-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_adds_exactly_one_import_package(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"medtpe"}
    assert "medtpe/py.typed" in names
    for data in (
        "medtpe/core/tasks/icu_mortality.yaml",
        "medtpe/core/fhir/default_mapping.yaml",
        "medtpe/service/page/static/index.html",
        "medtpe/service/page/static/examples/examples.json",
    ):
        assert data in names, data
    assert not any(name.startswith("medtpe/") and "/tests/" in name for name in names)


def test_the_entry_points_name_modules_of_the_package(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "medtpe = medtpe.cli.main:main" in text
    assert "medtpe = medtpe.inference.vllm_plugin:register" in text


def test_the_repository_root_has_few_folders() -> None:
    folders = sorted(
        p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
        and not p.name.endswith(".egg-info")
        and subprocess.run(["git", "ls-files", "--error-unmatch", p.name], cwd=ROOT,
                           capture_output=True).returncode == 0
    )  # fmt: skip
    assert len(folders) <= MAX_TOP_LEVEL_FOLDERS, folders
    assert {"medtpe", "tests", "docs", "deploy", "tools"} <= set(folders)


def test_the_checkout_has_no_other_top_level_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"medtpe", "tests", "tools"}
    assert Path(ROOT / "tools" / "__init__.py").is_file()
