"""`medtpe build-artefact` on a tiny Llama (tied, SmolLM2's tokenizer) and a synthetic MEDS
dataset, on the CPU: every step, the report, resuming after an interruption, and the clear
errors. The vLLM engine that pseudo-labels and answers is replaced by a fixed answer here (a fake
around the build; `test_build_artefact_qwen2.py` runs the real engine end to end)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402

import medtpe.training.examples  # noqa: E402
import medtpe.training.pseudo_labels  # noqa: E402
from medtpe.cli.main import cli  # noqa: E402
from medtpe.core.meds.readers import read_code_descriptions  # noqa: E402
from medtpe.core.tokenizer import MedTPETokenizer  # noqa: E402
from medtpe.core.tokenizer.artefact_manifest import (  # noqa: E402
    DESCRIPTIONS_FILE,
    MANIFEST_FILE,
    ArtefactBundle,
    Rendering,
)
from medtpe.core.tokenizer.build import build_tokenizer  # noqa: E402
from medtpe.core.tokenizer.corpus import iter_meds_corpus_texts  # noqa: E402
from medtpe.inference.engines.instant import InstantEngine  # noqa: E402
from medtpe.training import build_artefact as build_module  # noqa: E402
from medtpe.training.export import load_rows  # noqa: E402
from tests.support.meds_fixtures import train_tokenizer, write_meds_dataset  # noqa: E402
from tests.support.model_fixtures import tiny_llama  # noqa: E402

SETTINGS = """\
tasks: [icu_mortality, phenotyping]
budget: 24
n_train: 6
n_val: 3
held_out: 0.3
max_input_tokens: 700
length_mix: [500, 700]
serving_budgets: [600, 700]
n_gate: 3
mining_max_tokens: 900
losses: [ce, kl]
max_steps: 2
eval_every: 1
lr: 0.01
max_new_tokens: 8
device: cpu
"""
# the same settings with one SSFT run: its rows are trained ones (a KL run on this tiny model
# may keep its starting rows), and one run is all a build needs to reach its gate
CE_ONLY = SETTINGS.replace("losses: [ce, kl]", "losses: [ce]")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def meds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_meds_dataset(tmp_path_factory.mktemp("meds"), subjects=tuple(range(1, 11)))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "build.yaml"
    path.write_text(SETTINGS)
    return path


class Interrupted(Exception):
    """Stands in for a crash or Ctrl-C in the middle of a build."""


class FixedAnswers:
    """Stands in for the vLLM engine: the same answer ids (ending with eos) for every prompt."""

    def __init__(self, answer: Sequence[int]):
        self.answer = list(answer)
        self.calls: list[int] = []

    def __call__(
        self, model_dir: Path, prompts: Sequence[Sequence[int]], *_: object, **__: object
    ) -> list:
        self.calls.append(len(prompts))
        return [list(self.answer) for _ in prompts]


def _fixed_engine(base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> FixedAnswers:
    """Fixed pseudo-labels, and the gate's answers from an engine that answers at once (both
    modes the same: the gate passes), patched in with `monkeypatch`."""
    from medtpe.core.tokenizer import BaseTokenizer

    base = BaseTokenizer.load(base_dir)
    fake = FixedAnswers([*base.encode('yes"}'), base.tokenizer.token_to_id("<|im_end|>")])
    monkeypatch.setattr(medtpe.training.examples, "greedy_generate", fake)
    monkeypatch.setattr(medtpe.training.pseudo_labels, "greedy_generate", fake)
    monkeypatch.setattr(build_module, "start_vllm", InstantEngine.factory())
    return fake


@pytest.fixture
def engine(base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> FixedAnswers:
    """`_fixed_engine` for one test."""
    return _fixed_engine(base_dir, monkeypatch)


def _build(*args: str):
    return CliRunner().invoke(cli, ["build-artefact", *args], catch_exceptions=False)


def _args(config_file: Path, base_dir: Path, meds_dir: Path, out: Path) -> list[str]:
    paths = {"--config": config_file, "--base": base_dir, "--meds": meds_dir, "--out": out}
    return [part for option, path in paths.items() for part in (option, str(path))]


class Built(NamedTuple):
    """A finished build of `SETTINGS`: its output directory, what the command printed and the
    prompt counts the fixed engine was asked to label."""

    out: Path
    output: str
    engine_calls: list[int]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, base_dir: Path, meds_dir: Path) -> Built:
    """One build of `SETTINGS` from scratch (two mining workers), with the fixed engine; the
    tests that need a finished artefact read it or build again into a copy of it."""
    tmp = tmp_path_factory.mktemp("built")
    config_file = tmp / "build.yaml"
    config_file.write_text(SETTINGS)
    out = tmp / "artefact"
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake = _fixed_engine(base_dir, monkeypatch)
        result = _build(*_args(config_file, base_dir, meds_dir, out), "--workers", "2")
    assert result.exit_code == 0, result.output
    return Built(out, result.output, fake.calls)


@pytest.mark.slow
def test_build_writes_a_trained_artefact_and_its_report(built: Built, meds_dir: Path) -> None:
    out, output = built.out, built.output
    report = json.loads((out / "build_report.json").read_text())
    tokenizer = MedTPETokenizer.load(out)
    assert report["artefact_id"] == tokenizer.artefact_id and len(tokenizer.new_tokens) == 24
    assert report["base"]["tied_embeddings"] is True and report["base"]["eos_ids"] == [2]
    assert report["split"]["n_train_windows"] == 6 and report["split"]["n_val_windows"] == 3
    assert report["split"]["n_gate_windows"] == 3
    assert report["mine"]["n_records"] == report["split"]["n_train_times"] == 7
    assert set(report["ssft"]) == {"ce", "kl"} and report["pick"]["loss"] in ("ce", "kl")
    kept = report["ssft"][report["pick"]["loss"]]
    assert kept["steps"] == 2 and kept["best_val_loss"] <= kept["initial_val_loss"]
    # the kept loss is the one closest to the original model (held-out KL), whatever it trained
    assert report["pick"]["best_val"] == kept["best_val"]
    assert kept["best_val"]["kl"] == min(run["best_val"]["kl"] for run in report["ssft"].values())
    assert 0 < report["measure"]["compression"]["record_compression_rate"] < 1
    assert set(report["gate"]) == {"600", "700"}
    for gated in report["gate"].values():
        figures = gated["fidelity"]
        assert gated["dtype"] == "float32"  # the rows' own error, whatever the machine serves
        assert figures["n_records"] == 3 and figures["same_answer"]["value"] == 1.0
        assert figures["same_stop"] == 1.0 and gated["failures"] == []
    assert built.engine_calls == [9]  # one engine labels train and val; the gate answers on it
    manifest = ArtefactBundle.from_pretrained(out)
    assert manifest.validated_budgets == (600, 700)
    assert manifest.artefact_id == tokenizer.artefact_id
    # the text's code descriptions ship with it, recorded with the renderer's version
    assert manifest.descriptions == read_code_descriptions(meds_dir) != {}
    assert manifest.rendering == Rendering.of(manifest.descriptions)
    assert DESCRIPTIONS_FILE in report["files"]
    assert report["render"]["train_budgets"] == {"500": 3, "700": 3}  # the length mix
    assert report["render"]["train_tokens_original_max"] <= 700
    rows, _ = load_rows(out)
    assert rows.input.shape == (24, 16) and rows.output is None
    for name in ("training_curve_ce.csv", "training_curve_kl.csv", "tokenizer_config.json"):
        assert (out / name).is_file()
    assert not (out / ".build").exists()  # work dir removed once written
    assert f"MedTPE artefact {tokenizer.artefact_id}" in output
    assert "held-out compression" in output and "SSFT kl" in output
    gate_line = "fidelity gate at 700 tokens (3 held-out windows, float32): same answer 100.0%"
    assert gate_line in output


@pytest.mark.slow
def test_interrupted_build_resumes_from_its_last_step(
    config_file: Path,
    base_dir: Path,
    meds_dir: Path,
    tmp_path: Path,
    engine: FixedAnswers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "artefact"
    args = _args(config_file, base_dir, meds_dir, out)
    real_ssft = build_module.ArtefactBuild.ssft

    def interrupted(self: build_module.ArtefactBuild, loss: str) -> dict:
        if loss == "kl":
            raise Interrupted
        return real_ssft(self, loss)

    monkeypatch.setattr(build_module.ArtefactBuild, "ssft", interrupted)
    with pytest.raises(Interrupted):
        _build(*args)
    state = json.loads((out / ".build" / "state.json").read_text())
    assert list(state["steps"]) == ["check", "split", "render", "mine", "pseudo_label", "ssft_ce"]
    assert engine.calls == [9]

    changed = _build(*args, "--budget", "30")
    assert changed.exit_code == 2 and "other settings (budget)" in changed.output

    monkeypatch.setattr(build_module.ArtefactBuild, "ssft", real_ssft)
    resumed = _build(*args)
    assert resumed.exit_code == 0, resumed.output
    assert engine.calls == [9]  # no second pseudo-labelling
    report = json.loads((out / "build_report.json").read_text())
    assert report["step_seconds"]["ssft_ce"] == state["steps"]["ssft_ce"]["seconds"]
    assert set(report["ssft"]) == {"ce", "kl"}


class Rebuilt(NamedTuple):
    """`Built`'s artefact built over again (`CE_ONLY`, --restart, --budget 30): its directory,
    the manifest it held before, and the command's output and exit status."""

    out: Path
    first_manifest: dict[str, Any]
    output: str
    exit_code: int


@pytest.fixture(scope="module")
def rebuilt(
    built: Built, tmp_path_factory: pytest.TempPathFactory, base_dir: Path, meds_dir: Path
) -> Rebuilt:
    """A copy of `built`'s artefact directory built into again with other settings: CE only
    (its rows trained ones) and a budget of 30 new tokens, with the fixed engine."""
    tmp = tmp_path_factory.mktemp("rebuilt")
    config_file = tmp / "build.yaml"
    config_file.write_text(CE_ONLY)
    out = tmp / "artefact"
    shutil.copytree(built.out, out)  # the artefact a build of `SETTINGS` wrote
    first = json.loads((out / MANIFEST_FILE).read_text())
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fixed_engine(base_dir, monkeypatch)
        again = _build(*_args(config_file, base_dir, meds_dir, out), "--restart", "--budget", "30")
    return Rebuilt(out, first, again.output, again.exit_code)


@pytest.mark.slow
def test_a_rebuild_into_an_artefact_replaces_its_manifest(rebuilt: Rebuilt) -> None:
    """Building again into a directory that holds an artefact (other settings, --restart) writes
    a manifest for the new files instead of tripping over the earlier one's."""
    assert rebuilt.exit_code == 0, rebuilt.output
    second = json.loads((rebuilt.out / MANIFEST_FILE).read_text())
    assert second["content_digest"] != rebuilt.first_manifest["content_digest"]
    bundle = ArtefactBundle.from_pretrained(rebuilt.out)  # refuses a manifest that does not match
    assert bundle.digest() == second["content_digest"]
    assert bundle.validated_budgets == (600, 700)
    assert len(MedTPETokenizer.load(rebuilt.out).new_tokens) == 30  # the new settings


@pytest.mark.slow
def test_a_second_stage_continues_from_an_artefact(
    rebuilt: Rebuilt,
    config_file: Path,
    base_dir: Path,
    meds_dir: Path,
    tmp_path: Path,
    engine: FixedAnswers,
) -> None:
    """`init_from`: the earlier stage's merges (no mining) and its rows as SSFT's start. Stage 1
    is `rebuilt`'s artefact: CE only, so the rows it keeps are trained ones."""
    assert rebuilt.exit_code == 0, rebuilt.output
    first = rebuilt.out
    config_file.write_text(SETTINGS + f"init_from: {first}\n")
    second = tmp_path / "stage2"
    result = _build(*_args(config_file, base_dir, meds_dir, second))
    assert result.exit_code == 0, result.output
    report = json.loads((second / "build_report.json").read_text())
    assert report["mine"]["from"] == str(first)
    assert MedTPETokenizer.load(second).artefact_id == MedTPETokenizer.load(first).artefact_id
    earlier = json.loads((first / "build_report.json").read_text())
    kept = earlier["ssft"][earlier["pick"]["loss"]]
    # validation on the same held-out examples: each of stage 2's runs starts where stage 1's
    # kept rows ended, not from the constituents' mean (stage 1's step 0 of the same loss)
    assert kept["best_val_loss"] < kept["initial_val_loss"]
    for loss, run in report["ssft"].items():
        assert run["initial_val_loss"] == pytest.approx(kept["best_val"][loss])
    assert report["ssft"]["ce"]["initial_val_loss"] != pytest.approx(kept["initial_val_loss"])


@pytest.mark.slow
def test_a_build_that_fails_its_fidelity_gate_writes_nothing(
    config_file: Path,
    base_dir: Path,
    meds_dir: Path,
    tmp_path: Path,
    engine: FixedAnswers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MedTPE answers "no" where the original says "yes": the build exits non-zero, leaves the
    output directory without an artefact and keeps its figures; looser thresholds then let the
    same build write without answering again."""

    started: list[Path] = []

    class Contrary(InstantEngine):
        def __init__(self, model_dir: Path, *args: Any) -> None:
            super().__init__(model_dir, *args)
            started.append(model_dir)
            if (Path(model_dir) / "medtpe.json").is_file():  # the MedTPE export
                self.answer_ids = MedTPETokenizer.load(model_dir).encode('no"}')

    monkeypatch.setattr(build_module, "start_vllm", Contrary.factory())
    config_file.write_text(CE_ONLY)
    out = tmp_path / "artefact"
    args = _args(config_file, base_dir, meds_dir, out)
    failed = _build(*args)
    assert failed.exit_code == 1, failed.output[-600:]
    # the mortality windows answer "no" under MedTPE; the phenotyping one parses in neither
    # (and so does not count toward agreement)
    assert "fidelity gate failed (at 600 tokens: same answer 0.000 < 0.95" in failed.output
    assert not (out / "medtpe.json").exists() and not (out / "manifest.json").exists()
    state = json.loads((out / ".build" / "state.json").read_text())
    same = state["steps"]["gate"]["result"]["700"]["fidelity"]["same_answer"]["value"]
    assert same == 0.0
    records = state["steps"]["gate"]["result"]["700"]["records"]  # which windows, what each wrote
    assert len(records) == 3
    assert [r["original"]["key"] for r in records] == [r["medtpe"]["key"] for r in records]
    disagreeing = [r for r in records if r["original"]["prediction"] != r["medtpe"]["prediction"]]
    assert [r["medtpe"]["prediction"] for r in disagreeing] == [False] * len(disagreeing)
    assert disagreeing and all(r["medtpe"]["outputs"] for r in disagreeing)
    assert len(started) == 2  # one engine per mode
    passed = _build(*args, "--min-same-answer", "0")
    assert passed.exit_code == 0, passed.output
    assert len(started) == 2  # the recorded figures were held to the new threshold
    assert ArtefactBundle.from_pretrained(out).validated_budgets == (600, 700)


def test_unusable_base_models_are_refused(
    config_file: Path, base_dir: Path, meds_dir: Path, tmp_path: Path
) -> None:
    no_template = tmp_path / "no-template"
    shutil.copytree(base_dir, no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    result = _build(*_args(config_file, no_template, meds_dir, tmp_path / "a"))
    assert result.exit_code == 2 and "no chat template" in result.output

    word_level = tmp_path / "word-level"
    shutil.copytree(base_dir, word_level)
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
        str(word_level / "tokenizer.json")
    )
    result = _build(*_args(config_file, word_level, meds_dir, tmp_path / "b"))
    assert result.exit_code == 2 and "needs a tokenizer.json with a BPE model" in result.output

    other = tmp_path / "other-base-artefact"
    texts = list(iter_meds_corpus_texts(meds_dir))
    build_tokenizer(train_tokenizer(texts), texts, 4, progress=False).save(other)
    result = _build(*_args(config_file, base_dir, meds_dir, other))
    assert result.exit_code == 2 and "another base model's tokenizer" in result.output


def test_bad_settings_are_named(
    config_file: Path, base_dir: Path, meds_dir: Path, tmp_path: Path
) -> None:
    args = _args(config_file, base_dir, meds_dir, tmp_path / "out")
    config_file.write_text(SETTINGS + "n_epochs: 3\n")
    result = _build(*args)
    assert result.exit_code == 2 and "unknown build setting(s): n_epochs" in result.output
    config_file.write_text(SETTINGS.replace("losses: [ce, kl]", "losses: [mse]"))
    result = _build(*args)
    assert result.exit_code == 2 and "build setting 'losses'" in result.output
    config_file.write_text(SETTINGS)
    result = _build(*args, "--task", "no_such_task")
    assert result.exit_code == 2 and "no_such_task" in result.output
    result = CliRunner().invoke(cli, ["build-artefact", "--meds", str(meds_dir)])
    assert result.exit_code == 2 and "'base' is required" in result.output


@pytest.mark.slow
def test_distilled_build_needs_no_pseudo_labels(
    config_file: Path, base_dir: Path, meds_dir: Path, tmp_path: Path, engine: FixedAnswers
) -> None:
    """`distill` instead of SSFT: snippets of the rendered windows, then each prompt's last long
    window (the default artefact's recipe) from the snippets' best rows, its plain tail
    unmerged; no pseudo-labels, the distilled rows kept with the base head's rows for the
    reused ids (the export unties); the artefact's tokenizer keeps the plain tail."""
    settings = config_file.read_text().replace("losses: [ce, kl]", "losses: []")
    settings += (
        "plain_tail: 24\n"
        "distill: {snippets: 12, val_snippets: 4, snippet_tokens: 16, batch_size: 4,"
        " long_tokens: 96, long_snippets: 3, long_val_snippets: 2, long_windows: last}\n"
    )
    config_file.write_text(settings)
    out = tmp_path / "artefact"
    result = _build(*_args(config_file, base_dir, meds_dir, out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "build_report.json").read_text())
    assert "pseudo_label" not in report["step_seconds"] and report["ssft"] == {}
    distilled = report["distill"]
    assert distilled["coverage"]["train"]["snippets"] == 12 and distilled["steps"] == 6
    assert distilled["best_val_loss"] <= distilled["initial_val_loss"]
    long = distilled["long"]  # one window a step, from the snippets' best rows
    assert long["steps"] == 3 and long["settings"]["batch_size"] == 1
    assert long["coverage"]["train"]["teacher_tokens"] >= 3 * 96
    n_prompts = report["split"]["n_train_windows"], report["split"]["n_val_windows"]
    assert (long["pool"]["train"], long["pool"]["val"]) == n_prompts  # a prompt's last window
    assert MedTPETokenizer.load(out).plain_tail == 24
    assert report["pick"]["loss"] == "distill" and engine.calls == []
    rows, _ = load_rows(out)
    assert rows.output_base  # `output: base` (the default): the base head's rows, not stored
    for stage in ("distill", "distill-long"):  # each stage's curve, its last line its last step
        history = (out / f"{stage}-history.jsonl").read_text().splitlines()
        assert json.loads(history[-1])["step"] == (6 if stage == "distill" else 3)
    assert (out / MANIFEST_FILE).is_file() and "distill-long-history.jsonl" in report["files"]
