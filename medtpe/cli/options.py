"""Click options shared by several commands (`render`, `evaluate`, `predict`, `labels`, `verify`,
`outcomes`): one definition each, so their names, defaults and help read the same everywhere.

The parameter types check what a user gives as the command line is read (a task's name, an
input path, a URL), so a wrong value is a one-line usage error naming the option (exit status
2) before any dataset, model or engine loads."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, get_args
from urllib.parse import urlsplit

import click
import meds

from medtpe.core.meds.subject_split import DEFAULT_HELD_OUT, DEFAULT_SEED
from medtpe.core.prompt import PromptLayout, WindowPolicy
from medtpe.core.secret_masking import mask_secrets
from medtpe.core.tasks import TaskFileError, list_tasks
from medtpe.core.tokenizer.artefact_files import MEDTPE_FILE, TOKENIZER_FILE
from medtpe.inference.engines.protocol import Dtype
from medtpe.inference.model import ModelConfig
from medtpe.inference.predictor import Mode
from medtpe.inference.sampling import Sampling

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "MEDTPE_"

INPUT_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
INPUT_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
"""The type of an option naming an existing input directory."""


def one_line(text: str) -> str:
    """`text` on one line (a multi-line library message as an error line)."""
    return " ".join(text.split())


class TaskName(click.ParamType):
    """The name of a task `known` lists (default: the registered tasks, `$MEDTPE_TASKS_DIR`'s
    included); another name is a usage error naming the known ones."""

    name = "task"

    def __init__(self, known: Callable[[], Iterable[str]] = list_tasks, what: str = "task") -> None:
        self.known = known
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """`value` when it names a known task."""
        try:
            known = sorted(self.known())
        except TaskFileError as exc:
            self.fail(one_line(str(exc)), param, ctx)
        if value not in known:
            self.fail(f"unknown {self.what} {value!r}; known: {', '.join(known)}", param, ctx)
        return str(value)


TASK = TaskName()
"""The type of an option naming a registered task."""


class TaskNames(TaskName):
    """Comma-separated names of tasks `known` lists (`a,b,c`), each once: an unknown name or one
    named twice is a usage error (the unknown one naming the known tasks)."""

    name = "tasks"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        """The names of `value`, in its order, once each names a known task and none repeats."""
        if isinstance(value, tuple):
            return value
        names = [name.strip() for name in str(value).split(",")]
        for name in names:
            super().convert(name, param, ctx)
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            self.fail(f"{', '.join(map(repr, repeated))} named more than once", param, ctx)
        return tuple(names)


TASK_NAMES = TaskNames()
"""The type of an option naming one or more registered tasks (`a,b,c`)."""


class HoldingPath(click.Path):
    """An existing path; a directory given must hold the file `holds` (then `what` it is)."""

    def __init__(self, holds: str, what: str, *, file_okay: bool) -> None:
        super().__init__(exists=True, file_okay=file_okay, path_type=Path)
        self.holds = holds
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The path, once it exists and, as a directory, holds `holds`."""
        path = super().convert(value, param, ctx)
        if Path(path).is_dir() and not (Path(path) / self.holds).is_file():
            self.fail(f"{path} is not {self.what} (no {self.holds} in it)", param, ctx)
        return path


ARTEFACT_DIR = HoldingPath(MEDTPE_FILE, "a MedTPE artefact directory", file_okay=False)
"""The type of an option naming an existing MedTPE artefact directory."""
BASE_TOKENIZER = HoldingPath(TOKENIZER_FILE, "a tokenizer directory", file_okay=True)
"""The type of an option naming a base tokenizer: a `tokenizer.json` or a directory holding one."""


class Url(click.ParamType):
    """A URL of one of `schemes` (`scheme+driver` too where `drivers`), with a host where
    `host`; another value is a usage error saying what is expected, its secrets masked."""

    name = "url"

    def __init__(
        self, schemes: tuple[str, ...], expected: str, *, host: bool, drivers: bool = False
    ) -> None:
        self.schemes = schemes
        self.expected = expected
        self.host = host
        self.drivers = drivers

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """`value` when it is such a URL."""
        text = str(value)
        try:
            parts = urlsplit(text)
            host = parts.hostname
        except ValueError:
            parts, host = None, None
        scheme = parts.scheme if parts else ""
        if self.drivers:
            scheme = scheme.partition("+")[0]
        if parts is None or scheme not in self.schemes or "://" not in text:
            self.fail(f"{mask_secrets(text)!r} is not {self.expected}", param, ctx)
        if self.host and not host:
            self.fail(f"{mask_secrets(text)!r} names no host: expected {self.expected}", param, ctx)
        return text


HTTP_URL = Url(("http", "https"), "an http(s) URL (https://HOST/PATH)", host=True)
"""The type of an option naming a web address (a FHIR server, a published document)."""
LEDGER_URL = Url(
    ("sqlite", "postgresql", "postgres"),
    "a ledger URL (sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB)",
    host=False,
    drivers=True,
)
"""The type of an option naming the prediction ledger's database."""


def meds_dir_option(
    help: str = "MEDS dataset directory (data/, metadata/).", required: bool = True
) -> Callable[[F], F]:
    """`--meds DIR` (`meds_dir`): the MEDS dataset a command reads; `help` says what it holds."""
    return click.option("--meds", "meds_dir", required=required, type=INPUT_DIR, help=help)


def fhir_dirs_option(help: str) -> Callable[[F], F]:
    """`--fhir DIR`, repeatable (`fhir_dirs`): FHIR Bulk Data export directories a command reads
    in place of `--meds`; `help` says how."""
    return click.option("--fhir", "fhir_dirs", multiple=True, type=INPUT_DIR, help=help)


MEDS_DIR_OPTION = meds_dir_option()
"""The `--meds DIR` option of the commands that read a MEDS dataset."""
ALL_SPLITS = "all"
SPLITS = (meds.train_split, meds.tuning_split, meds.held_out_split, ALL_SPLITS)
"""`--split` choices: a split of `medtpe.core.meds.subject_split` (the dataset's
`metadata/subject_splits.parquet`, else a seeded held-out fraction), or every subject."""


def split_name(split: str) -> str | None:
    """A `--split` value as the split to keep (None: every subject)."""
    return None if split == ALL_SPLITS else split


TASK_OPTION = click.option(
    "--task",
    "task_name",
    required=True,
    type=TASK,
    envvar="MEDTPE_TASK",
    show_envvar=True,
    help="Task name (e.g. icu_mortality); MEDS-DEV's model.yaml gives it as the variable.",
)
"""`--task NAME` of the commands that score a task (MEDS-DEV sets $MEDTPE_TASK)."""
TASKS_OPTION = click.option(
    "--task",
    "task_names",
    required=True,
    type=TASK_NAMES,
    envvar="MEDTPE_TASK",
    show_envvar=True,
    help="Task name (e.g. icu_mortality), or several comma-separated (icu_mortality,"
    "readmission_30d): each record is read and rendered once for all of them, and each task "
    "gets its predictions under <out>/<task>/. MEDS-DEV's model.yaml gives it as the variable.",
)
"""`--task NAME[,NAME...]` of the commands that score one or more tasks per record."""


def split_option(default: str, note: str = "") -> Callable[[F], F]:
    """`--split` (one of `SPLITS`), defaulting to `default`; `note` ends its help."""
    return click.option(
        "--split",
        type=click.Choice(SPLITS),
        default=default,
        show_default=True,
        help="Only the subjects of this split: metadata/subject_splits.parquet's, or without one "
        f"{DEFAULT_HELD_OUT:.0%} of the records' subjects held out (seed {DEFAULT_SEED}){note}.",
    )


def together(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `options`, listed in `--help` in this order."""

    def apply(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return apply


SAMPLING_OPTIONS = together(
    click.option("--n-samples", type=click.IntRange(min=1), default=1, show_default=True),
    click.option(
        "--temperature",
        type=click.FloatRange(min=0.0),
        default=None,
        help="Sampling temperature [default: 0 for one sample, 0.7 for majority voting].",
    ),
    click.option(
        "--constrained/--free",
        default=False,
        show_default=True,
        help="Constrain decoding to well-formed answers (vLLM structured outputs).",
    ),
)
"""`--n-samples`, `--temperature` and `--constrained/--free` (see `sampling`)."""


def sampling(
    n_samples: int, temperature: float | None, max_new_tokens: int, constrained: bool
) -> Sampling:
    """The decoding of `SAMPLING_OPTIONS` and `--max-new-tokens`, the answer options'
    probabilities asked for; `--temperature`'s default: 0 (greedy) for one sample, 0.7 for
    majority voting."""
    if temperature is None:
        temperature = 0.0 if n_samples == 1 else 0.7
    return Sampling(n_samples, temperature, max_new_tokens, constrained=constrained)


MODEL_OPTION_FLAGS: dict[str, tuple[str, str, click.ParamType | None, str | None]] = {
    "model_dir": ("--model", "model_dir", click.Path(path_type=Path), None),
    "artefact_dir": ("--artefact", "artefact_dir", ARTEFACT_DIR, None),
    "export_dir": ("--export-dir", "export_dir", click.Path(path_type=Path), None),
    "mode": ("--mode", "mode", click.Choice(get_args(Mode)), "MODE"),
    "max_input_tokens": (
        "--max-input-tokens",
        "max_input_tokens",
        click.IntRange(min=1),
        "MAX_INPUT_TOKENS",
    ),
    "max_new_tokens": (
        "--max-new-tokens",
        "max_new_tokens",
        click.IntRange(min=1),
        "MAX_NEW_TOKENS",
    ),
    "window_policy": (
        "--window-policy",
        "window_policy",
        click.Choice([p.value for p in WindowPolicy]),
        "WINDOW_POLICY",
    ),
    "prompt_layout": (
        "--prompt-layout",
        "prompt_layout",
        click.Choice([layout.value for layout in PromptLayout]),
        "PROMPT_LAYOUT",
    ),
    "window_grid_hours": (
        "--window-grid-hours",
        "window_grid_hours",
        click.IntRange(min=1),
        "WINDOW_GRID_HOURS",
    ),
    "max_num_seqs": ("--concurrency", "concurrency", click.IntRange(min=1), "MAX_CONCURRENCY"),
    "kv_cache_gib": ("--kv-cache-gib", "kv_cache_gib", click.FloatRange(min=0.1), "KV_CACHE_GIB"),
    "seed": ("--seed", "seed", click.INT, "SEED"),
    "dtype": ("--dtype", "dtype", click.Choice(get_args(Dtype)), "DTYPE"),
    "enforce_eager": ("--enforce-eager/--compile", "enforce_eager", None, "ENFORCE_EAGER"),
}
"""The command-line flag, parameter name, type and service setting (`MEDTPE_<name>`) of each
model or engine option (`ModelConfig.from_options`)."""


def model_options(*names: str, env: bool = False, **helps: str) -> Callable[[F], F]:
    """The click options of the model or engine options `names`, with the default and help
    declared in `ModelConfig` / `EngineOptions` (`ModelConfig.declared`), none copied; `env`:
    each reads its service setting's `MEDTPE_*` variable too; `helps[name]` replaces a help
    where the command does more (e.g. prepares a missing export)."""
    made = []
    for name in names:
        flag, parameter, kind, setting = MODEL_OPTION_FLAGS[name]
        option = ModelConfig.declared(name)
        default = None if option.factory is not None else option.default
        if isinstance(default, Enum):
            default = default.value
        extra = {"envvar": f"{ENV_PREFIX}{setting}", "show_envvar": True} if env and setting else {}
        made.append(
            click.option(
                flag,
                parameter,
                type=kind,
                default=default,
                show_default=default is not None,
                help=helps.get(name, option.help),
                **extra,
            )
        )
    return together(*made)


MODEL_FILES_OPTIONS = model_options(
    "model_dir",
    "artefact_dir",
    "export_dir",
    export_dir="Exported MedTPE checkpoint (written from --model and --artefact when missing or "
    "stale).",
)
"""`--model`, `--artefact` and `--export-dir` (see `model_files`)."""


def model_files(
    model_dir: Path | None, artefact_dir: Path | None, export_dir: Path | None
) -> dict[str, Path]:
    """The `ModelConfig` paths of `MODEL_FILES_OPTIONS` that were given (the others keep their
    declared defaults in `ModelConfig.from_options`)."""
    given = {"model_dir": model_dir, "artefact_dir": artefact_dir, "export_dir": export_dir}
    return {name: path for name, path in given.items() if path is not None}


FHIR_MAPPING_OPTION = click.option(
    "--fhir-mapping",
    type=INPUT_FILE,
    envvar="MEDTPE_FHIR_MAPPING",
    show_envvar=True,
    default=None,
    help="With FHIR input: the site's FHIR mapping (YAML) [default: the shipped one].",
)
"""`--fhir-mapping` of every command that reads FHIR input."""
