"""`medtpe build-artefact`: a Hugging Face causal LM and a MEDS dataset in, a MedTPE artefact
(tokenizer files, trained rows, build report) out, in resumable steps:

check → split → render → mine → pseudo_label → ssft_<loss>… → pick → measure → write

Each finished step's result is recorded in `<work>/state.json` (default work dir:
`<out>/.build/`); a re-run with the same settings skips the finished steps (SSFT itself resumes
from its last checkpoint), other settings are refused unless the build is restarted. The work
dir is removed after `write` unless `keep_work` is set; `build_report.json` stays in the
artefact.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from medtpe_core.build import build_tokenizer_from_meds, default_protected_texts
from medtpe_core.corpus import CorpusSpec
from medtpe_core.tasks import get_task
from medtpe_core.tokenizer import MedTPETokenizer
from training.base_model import BaseModelInfo, check_artefact_base, inspect_base_model
from training.build_config import BuildConfig, BuildConfigError, to_dict
from training.build_data import (
    assign_tasks,
    prediction_times,
    render_windows,
    sample,
    split_subjects,
    window_from_record,
    window_record,
    write_label_file,
)
from training.build_report import (
    REPORT_FILE,
    answer_agreement,
    answer_text,
    compression,
)
from training.examples import load_examples
from training.pipeline import SUMMARY_FILE, cached_examples, examples_path, read_records
from training.ssft import HISTORY_FILE, SSFTConfig

STATE_FILE = "state.json"
TOKENIZER_DIR = "tokenizer"
EXAMPLES_DIR = "examples"
WINDOWS_FILE = "windows.json"
MINING_LABELS_FILE = "mining-labels.parquet"


class BuildStateError(ValueError):
    """The work directory holds a build with other settings."""


class BuildState:
    """The finished steps of a build and their results (`<work>/state.json`)."""

    def __init__(self, path: Path, identity: dict[str, Any]):
        self.path = path
        self.steps: dict[str, Any] = {}
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved["identity"] != identity:
                changed = sorted(
                    k
                    for k in saved["identity"].keys() | identity.keys()
                    if saved["identity"].get(k) != identity.get(k)
                )
                raise BuildStateError(
                    f"{path.parent} holds a build with other settings ({', '.join(changed)}): "
                    "restart it (--restart) or choose another output directory"
                )
            self.steps = saved["steps"]
        self.identity = identity

    def done(self, name: str) -> bool:
        """Whether step `name` has finished."""
        return name in self.steps

    def finish(self, name: str, result: Any, seconds: float) -> None:
        """Record step `name`'s result (written atomically)."""
        self.steps[name] = {"result": result, "seconds": round(seconds, 1)}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"identity": self.identity, "steps": self.steps}, indent=1))
        os.replace(tmp, self.path)

    def result(self, name: str) -> Any:
        """Step `name`'s recorded result."""
        return self.steps[name]["result"]


class ArtefactBuild:
    """One build: its settings, base model facts, work directory and state."""

    def __init__(self, config: BuildConfig, restart: bool = False):
        self.config = config
        self.work = config.work_dir
        if config.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise BuildConfigError("build setting 'device': cuda requested, none available")
        self.info: BaseModelInfo = inspect_base_model(config.base)
        check_artefact_base(config.out, self.info)
        if restart and self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True, exist_ok=True)
        identity = config.identity() | {"base_tokenizer": self.info.tokenizer_fingerprint}
        self.state = BuildState(self.work / STATE_FILE, identity)

    def steps(self) -> list[tuple[str, Callable[[], Any]]]:
        """The build's steps in order."""
        ssft = [(f"ssft_{loss}", lambda loss=loss: self.ssft(loss)) for loss in self.config.losses]
        return [
            ("check", self.check),
            ("split", self.split),
            ("render", self.render),
            ("mine", self.mine),
            ("pseudo_label", self.pseudo_label),
            *ssft,
            ("pick", self.pick),
            ("measure", self.measure),
            ("write", self.write),
        ]

    def run(self) -> dict[str, Any]:
        """Run the unfinished steps; returns the build report."""
        steps = self.steps()
        bar = tqdm(steps, desc="build-artefact", unit="step")
        for name, step in bar:
            bar.set_description(f"build-artefact [{name}]")
            if not self.state.done(name):
                started = time.perf_counter()
                self.state.finish(name, step(), time.perf_counter() - started)
        bar.close()
        report = self.report()
        if not self.config.keep_work:
            shutil.rmtree(self.work)
        return report

    # --- the steps ---

    def check(self) -> dict[str, Any]:
        """The base model's facts (checked when the build object was made)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.info).items()}

    def split(self) -> dict[str, Any]:
        """Subjects split; the SSFT windows sampled; the mining corpus's label file."""
        config = self.config
        times = prediction_times(config)
        train_subjects, held_subjects = split_subjects(
            [s for s, _ in times], config.held_out, config.seed
        )
        held = set(held_subjects)
        train_times = [(s, t) for s, t in times if s not in held]
        held_times = [(s, t) for s, t in times if s in held]
        windows = {
            "train": sample(assign_tasks(train_times, config.tasks), config.n_train, config.seed),
            "val": sample(assign_tasks(held_times, config.tasks), config.n_val, config.seed),
        }
        records = {k: [window_record(w) for w in v] for k, v in windows.items()}
        (self.work / WINDOWS_FILE).write_text(json.dumps(records, indent=0))
        write_label_file(self.work / MINING_LABELS_FILE, train_times)
        return {
            "train_subjects": train_subjects,
            "held_out_subjects": held_subjects,
            "n_train_times": len(train_times),
            "n_held_out_times": len(held_times),
            "n_train_windows": len(windows["train"]),
            "n_val_windows": len(windows["val"]),
        }

    def render(self) -> dict[str, Any]:
        """The sampled windows' prompts at `max_input_tokens`: train.jsonl, val.jsonl."""
        saved = json.loads((self.work / WINDOWS_FILE).read_text())
        result = {}
        for split, records in saved.items():
            windows = [window_from_record(r) for r in records]
            lines = render_windows(self.config, windows, self.work / f"{split}.jsonl", split)
            result[f"{split}_tokens_original"] = sum(r["n_tokens_original"] for r in lines)
        return result

    def mine(self) -> dict[str, Any]:
        """The MedTPE tokenizer from the training subjects' records at the prediction times."""
        config = self.config
        spec = CorpusSpec(
            config.meds,
            config.mining_max_tokens,
            subjects=frozenset(self.state.result("split")["train_subjects"]),
            labels=self.work / MINING_LABELS_FILE,
        )
        tok = build_tokenizer_from_meds(
            config.base,
            spec,
            config.budget,
            config.max_n,
            config.method,
            default_protected_texts(config.base),
            workers=config.workers,
            ray_address=config.ray_address,
        )
        tok.save(self.work / TOKENIZER_DIR)
        stats = tok.corpus_stats
        return {
            "artefact_id": tok.artefact_id,
            "n_new_tokens": len(tok.new_tokens),
            "n_records": stats["n_records"],
            "n_tokens": stats["n_tokens"],
            "sample_compression_rate": stats["sample_compression_rate"],
        }

    def _prompts(self, split: str) -> list[str]:
        return [r["prompt"] for r in read_records(self.work / f"{split}.jsonl")]

    def _examples_file(self, split: str, run_dir: Path | None = None) -> Path:
        tag = self.state.result("mine")["artefact_id"]
        return examples_path(run_dir or self.work / EXAMPLES_DIR, tag, split)

    def pseudo_label(self) -> dict[str, Any]:
        """The original model's greedy answers to every prompt (vLLM), cached as examples."""
        tokenizer = MedTPETokenizer.load(self.work / TOKENIZER_DIR)
        (self.work / EXAMPLES_DIR).mkdir(exist_ok=True)
        result = {}
        for split in ("train", "val"):
            examples = cached_examples(
                self._examples_file(split),
                self.config.base,
                tokenizer,
                self._prompts(split),
                self.config.max_new_tokens,
            )
            ended = sum(bool(e.response) and e.response[-1] in self.info.eos_ids for e in examples)
            result[split] = {"n": len(examples), "n_ended_by_eos": ended}
        return result

    def ssft(self, loss: str) -> dict[str, Any]:
        """SSFT with `loss` in its own copy of the tokenizer artefact (resumes a checkpoint)."""
        from training.pipeline import run_ssft

        config = self.config
        artefact = self.work / f"artefact-{loss}"
        if not artefact.is_dir():
            shutil.copytree(self.work / TOKENIZER_DIR, artefact)
        run_dir = self.work / "runs" / loss
        run_dir.mkdir(parents=True, exist_ok=True)
        for split in ("train", "val"):
            cached = self._examples_file(split, run_dir)
            if not cached.is_file():
                shutil.copyfile(self._examples_file(split), cached)
        ssft_config = SSFTConfig(
            loss=loss,
            lr=config.lr,
            epochs=config.epochs,
            max_steps=config.max_steps,
            eval_every=config.eval_every,
            patience=config.patience,
            seed=config.seed,
            device=config.device,
        )
        run_ssft(
            config.base,
            artefact,
            self._prompts("train"),
            self._prompts("val"),
            run_dir,
            ssft_config,
            config.max_new_tokens,
        )
        return json.loads((run_dir / SUMMARY_FILE).read_text())

    def pick(self) -> dict[str, Any]:
        """The loss whose rows have the lowest held-out pseudo-label loss."""
        losses = {loss: self.state.result(f"ssft_{loss}") for loss in self.config.losses}
        best = min(losses, key=lambda loss: losses[loss]["best_val_loss"])
        return {"loss": best, "best_val_loss": losses[best]["best_val_loss"]}

    def _kept(self) -> Path:
        return self.work / f"artefact-{self.state.result('pick')['loss']}"

    def measure(self) -> dict[str, Any]:
        """Held-out compression and, if enabled, answer agreement with the original model."""
        tokenizer = MedTPETokenizer.load(self._kept())
        records = read_records(self.work / "val.jsonl")
        result: dict[str, Any] = {
            "compression": compression(
                tokenizer, [r["prompt"] for r in records], [r["text"] for r in records]
            )
        }
        if self.config.measure_agreement:
            result["agreement"] = self._agreement(tokenizer, records)
        return result

    def _agreement(self, tokenizer: MedTPETokenizer, records: list[dict[str, Any]]) -> dict:
        """Export the kept artefact, answer the held-out prompts greedily, compare."""
        from training.export import export_checkpoint
        from training.pseudo_labels import greedy_generate

        examples = load_examples(self._examples_file("val"))
        export_dir = export_checkpoint(self.config.base, self._kept(), self.work / "export")
        prompts = [e.student for e in examples]
        max_len = max(map(len, prompts)) + self.config.max_new_tokens
        answers = greedy_generate(export_dir, prompts, self.config.max_new_tokens, max_len)
        shutil.rmtree(export_dir)
        eos = self.info.eos_ids
        prefixes = [get_task(r["task"]).response_prefix for r in records]
        student = [
            answer_text(tokenizer, a, eos, p) for a, p in zip(answers, prefixes, strict=True)
        ]
        teacher = [
            answer_text(tokenizer, e.response, eos, p)
            for e, p in zip(examples, prefixes, strict=True)
        ]
        return answer_agreement([r["task"] for r in records], student, teacher)

    def write(self) -> dict[str, Any]:
        """The kept artefact's files, the SSFT curves and the report into the output dir."""
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted(self._kept().iterdir()):
            if path.is_file():
                shutil.copyfile(path, out / path.name)
                written.append(path.name)
        for loss in self.config.losses:
            history = self.work / "runs" / loss / HISTORY_FILE
            name = f"training_curve_{loss}.csv"
            shutil.copyfile(history, out / name)
            written.append(name)
        written.append(REPORT_FILE)
        (out / REPORT_FILE).write_text(json.dumps(self.report(written), indent=2) + "\n")
        return {"files": written}

    def report(self, files: list[str] | None = None) -> dict[str, Any]:
        """The build report: settings, base model, every step's result and time."""
        steps = self.state.steps
        ssft = {loss: steps[f"ssft_{loss}"]["result"] for loss in self.config.losses}
        return {
            "artefact_id": steps["mine"]["result"]["artefact_id"],
            "out": str(self.config.out),
            "base": steps["check"]["result"],
            "settings": to_dict(self.config),
            "split": {k: v for k, v in steps["split"]["result"].items() if "subjects" not in k},
            "mine": steps["mine"]["result"],
            "pseudo_label": steps["pseudo_label"]["result"],
            "ssft": ssft,
            "pick": steps["pick"]["result"],
            "measure": steps["measure"]["result"],
            "files": files or steps.get("write", {}).get("result", {}).get("files", []),
            "step_seconds": {name: step["seconds"] for name, step in steps.items()},
            "seconds": sum(step["seconds"] for step in steps.values()),
        }
