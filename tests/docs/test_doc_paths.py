"""Every repository path, module and link a document names exists.

The documents: every Markdown file of the repository (README.md, docs/, each package's and
artefact's README) except the research logs under docs/research/, which record what was run on
a given day with the files of that day (git keeps those). What is checked, anywhere in a
document's text (prose, inline code and fenced blocks alike):

- a path that starts with one of the repository's top-level folders (`medtpe/service/x.py`,
  `tests/...`, `deploy/k8s/`): it exists; `*` globs match at least one file and `{a,b}` stands for
  both. A path with a placeholder (`<shard>`, `$budget`, `…`) or through a hidden folder
  (`.cache/`, `.build/`) is not a repository path and is skipped, as is anything after `../`
  (`../shared`), inside a URL, or after a git revision: a file the repository no longer holds is
  named the way `git show` reads it, `95bf344:benchmarks/bench_x.py`;
- a dotted name in one of the Python packages (`medtpe.inference.engines.protocol.EngineOptions`,
  `python -m benchmarks.bench_x`): the module exists and defines the name (a class's method one
  level further down); a capitalised placeholder (`tools.benchmarks.NAME`) and a logger's name
  (`medtpe.audit`) are skipped;
- a Markdown link's target, relative to the document, and its `#anchor` when it points at a
  heading of a Markdown file.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# Folders whose files are not documents of the product: fixtures, build and cache output, the
# research logs (dated records; see the module docstring).
EXCLUDED = {"tests/fixtures", "docs/research"}
# The top-level folders a document's path may start with: today's, and those a document might
# still name after they are gone (the check must fail then, not skip the path).
KNOWN_TOPS = {
    "artefacts", "batch", "benchmarks", "deploy", "docs", "evaluation", "inference", "ledger",
    "medtpe", "medtpe_cli", "medtpe_core", "meds_dev", "monitoring", "requirements", "research",
    "scripts", "service", "tests", "tools", "training",
}  # fmt: skip
KNOWN_PACKAGES = KNOWN_TOPS - {"artefacts", "deploy", "docs", "meds_dev", "requirements", "scripts"}
FILE_SUFFIXES = {
    "cfg", "csv", "gz", "html", "ini", "jinja", "js", "json", "jsonl", "md", "ndjson", "parquet",
    "pq", "py", "safetensors", "toml", "txt", "yaml", "yml",
}  # fmt: skip


def _tops() -> list[str]:
    present = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    return sorted(KNOWN_TOPS | present, key=len, reverse=True)


def _packages() -> list[str]:
    present = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    return sorted(KNOWN_PACKAGES | present, key=len, reverse=True)


# A path: not inside a word, a URL, a hidden or a parent folder (the lookbehind).
TOPS = "|".join(map(re.escape, _tops()))
PACKAGES = "|".join(map(re.escape, _packages()))
PATH = re.compile(rf"(?<![\w./~@:$-])((?:{TOPS})/[\w./*{{}},<>…$-]*)")
DOTTED = re.compile(rf"(?<![\w./~@:-])((?:{PACKAGES})(?:\.\w+)+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[<$]|…|\.\.\.")


def documents() -> list[Path]:
    """Every Markdown document of the repository that this check covers."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        rel = here.relative_to(ROOT).as_posix()
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and not d.endswith(".egg-info")
            and d not in {"node_modules", "__pycache__"}
            and (f"{rel}/{d}" if rel != "." else d) not in EXCLUDED
        ]
        found += [here / f for f in files if f.endswith(".md")]
    return sorted(found)


def expand_braces(path: str) -> list[str]:
    """`a_{1,2}.json` → `a_1.json`, `a_2.json` (shell brace expansion, no nesting)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def repository_paths(text: str) -> Iterator[str]:
    """The repository paths written in `text`, placeholders and hidden folders left out (a
    link's target is read relative to its document: `link_problem`)."""
    for match in PATH.finditer(LINK.sub("]()", text)):
        path = match.group(1).rstrip(".,")
        if PLACEHOLDER.search(path) or any(p.startswith(".") for p in path.split("/")[1:] if p):
            continue
        yield from expand_braces(path)


def path_exists(path: str) -> bool:
    """Whether `path` (a glob when it holds `*`) names something in the repository."""
    if "*" in path:
        return next(ROOT.glob(path), None) is not None
    return (ROOT / path).exists()


@cache
def defined_names(module_file: Path) -> dict[str, set[str]]:
    """A module's top-level names, each mapped to its members when it is a class."""
    tree = ast.parse(module_file.read_text(), filename=str(module_file))
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                getattr(n, "name", None) or t.id
                for n in node.body
                for t in (getattr(n, "targets", None) or [getattr(n, "target", n)])
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                or isinstance(t, ast.Name)
            }
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: set() for a in node.names})
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in getattr(node, "targets", None) or [node.target]:
                names.update({n.id: set() for n in ast.walk(target) if isinstance(n, ast.Name)})
    return names


def module_file(parts: list[str]) -> Path | None:
    """The source file of the module `parts` names, if there is one."""
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def logger_names() -> frozenset[str]:
    """The names of the product's loggers (`medtpe.audit`): dotted, but not modules."""
    found = set()
    for path in (ROOT / "medtpe").rglob("*.py"):
        found.update(re.findall(r"getLogger\(\s*\"([\w.]+)\"", path.read_text()))
    return frozenset(found)


def dotted_problem(name: str) -> str | None:
    """Why a dotted module name (with an optional attribute) does not resolve, or None."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None  # a file name such as `service.yaml`
    if name in logger_names():
        return None
    depth = next((i for i in range(len(parts), 0, -1) if module_file(parts[:i])), 0)
    rest = parts[depth:]
    if not rest:
        return None
    if re.fullmatch(r"[A-Z]+", rest[0]):
        return None  # a placeholder: `tools.benchmarks.NAME`
    source = module_file(parts[:depth])
    names = defined_names(source) if source else {}
    if rest[0] not in names:
        return f"{'.'.join(parts[:depth])} defines no {rest[0]}"
    if len(rest) > 1 and names[rest[0]] and rest[1] not in names[rest[0]]:
        return f"{'.'.join(parts[: depth + 1])} has no member {rest[1]}"
    return None


def heading_anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def link_problem(document: Path, target: str) -> str | None:
    """Why a link of `document` leads nowhere, or None (external links are not followed)."""
    if re.match(r"[a-z]+:", target):
        return None
    path, _, anchor = target.partition("#")
    destination = (document.parent / path).resolve() if path else document
    if not destination.exists():
        return "no such file"
    if anchor and destination.suffix == ".md" and anchor not in heading_anchors(destination):
        return f"no heading #{anchor}"
    return None


DOCUMENTS = documents()


def _id(document: Path) -> str:
    return document.relative_to(ROOT).as_posix()


def test_the_documents_are_found() -> None:
    names = {_id(d) for d in DOCUMENTS}
    assert {"README.md", "docs/architecture.md", "docs/cli.md", "tests/README.md"} <= names
    assert not any(n.startswith("docs/research/") for n in names)


@pytest.mark.parametrize("document", DOCUMENTS, ids=_id)
def test_every_path_a_document_names_exists(document: Path) -> None:
    missing = sorted({p for p in repository_paths(document.read_text()) if not path_exists(p)})
    assert not missing, f"{_id(document)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=_id)
def test_every_module_a_document_names_defines_the_name(document: Path) -> None:
    problems = {
        name: why
        for name in set(DOTTED.findall(document.read_text()))
        if (why := dotted_problem(name))
    }
    assert not problems, f"{_id(document)} names what the code lacks: {problems}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=_id)
def test_every_link_of_a_document_leads_somewhere(document: Path) -> None:
    problems = {
        target: why
        for target in LINK.findall(document.read_text())
        if (why := link_problem(document, target))
    }
    assert not problems, f"{_id(document)} has broken links: {problems}"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see `medtpe/service/x.py` and tests/x/", ["medtpe/service/x.py", "tests/x/"]),
        ("`tools/r/a_{1,2}.json`.", ["tools/r/a_1.json", "tools/r/a_2.json"]),
        ("`.cache/tests/x`, ../shared/data, https://h.org/docs/x.md", []),
        ("`tools/benchmarks/results/<name>.json`, `tools/research/results/…`", []),
        ("artefacts/a/.build/x, `95bf344:benchmarks/gone.py`, `tools/r/b_$budget.json`", []),
        ("[log](tools/research/log.md)", []),
    ],
)  # fmt: skip
def test_repository_paths_are_read_from_prose_and_code(text: str, found: list[str]) -> None:
    assert list(repository_paths(text)) == found


def test_a_gone_module_and_a_gone_name_are_reported() -> None:
    assert dotted_problem("medtpe.inference.engines.protocol") is None
    assert dotted_problem("medtpe.inference.engines.protocol.EngineOptions") is None
    assert dotted_problem("tools.benchmarks.NAME") is None
    assert dotted_problem("medtpe.audit") is None  # a logger's name
    assert dotted_problem("service.yaml") is None
    assert (
        dotted_problem("medtpe.inference.engines.protocol.NoSuchThing")
        == "medtpe.inference.engines.protocol defines no NoSuchThing"
    )
    assert dotted_problem("medtpe.no_such_module") == "medtpe defines no no_such_module"
    assert dotted_problem("inference.engine") == " defines no inference"  # a gone top level
