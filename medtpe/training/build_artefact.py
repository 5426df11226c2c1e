"""`medtpe build-artefact`: a Hugging Face causal LM and a MEDS dataset in, a MedTPE artefact
(tokenizer files, trained rows, build report) out, in resumable steps:

check → split → render → mine → [distill] → [pseudo_label → ssft_<loss>…] → pick → measure → gate
→ write

The windows are rendered at the budgets of the length mix, which reaches the serving budget;
`distill` (token-level distillation, `medtpe.training.token_distillation`) trains the rows on short
snippets of them; SSFT, when `losses` names any, trains on the whole windows against the
original model's answers;
the gate answers held-out windows at every serving budget in both modes and holds their fidelity
to the thresholds (`medtpe.training.fidelity_gate`): a build that fails it stops before `write`
(non-zero exit, nothing written into the output directory, the work dir kept), one that passes
writes the artefact with a manifest naming the budgets it was validated at
(`medtpe.core.tokenizer.artefact_manifest`).

Each finished step's result is recorded in `<work>/state.json` (default work dir:
`<out>/.build/`); a re-run with the same settings skips the finished steps (SSFT itself resumes
from its last checkpoint), other settings are refused unless the build is restarted. The work
dir is removed after `write` unless `keep_work` is set; `build_report.json` stays in the
artefact.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from medtpe.core.meds import PredictionPoint
from medtpe.core.meds.readers import read_code_descriptions
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.metrics.fidelity import Thresholds
from medtpe.core.prompt.layout import DEFAULT_LAYOUT
from medtpe.core.prompt.render import RENDER_VERSION
from medtpe.core.tasks.answers import ANSWER_END
from medtpe.core.tokenizer.artefact_manifest import (
    DESCRIPTIONS_FILE,
    MANIFEST_FILE,
    ROWS_FILE,
    ArtefactBundle,
    content_digest,
)
from medtpe.core.tokenizer.build import build_tokenizer_from_meds, default_protected_texts
from medtpe.core.tokenizer.corpus import CorpusSpec
from medtpe.core.tokenizer.medtpe_tokenizer import PLAIN_TAIL, MedTPETokenizer
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.inference.model import ModelConfig, model_context_length
from medtpe.training.base_model import BaseModelInfo, check_artefact_base, inspect_base_model
from medtpe.training.build_config import BuildConfig, BuildConfigError, to_dict
from medtpe.training.build_data import (
    assign_tasks,
    prediction_times,
    render_windows,
    sample,
    with_budgets,
    write_label_file,
)
from medtpe.training.build_report import REPORT_FILE, compression
from medtpe.training.build_state import STATE_FILE, BuildState
from medtpe.training.distill_config import DistillConfig, long_stage
from medtpe.training.embedding_init import NewRows
from medtpe.training.pseudo_labels import BUILD_KV_CACHE_GIB
from medtpe.training.ssft import HISTORY_FILE, SSFTConfig
from medtpe.training.ssft_pipeline import SUMMARY_FILE, cached_examples, examples_path, read_records
from medtpe.training.token_distillation import HISTORY_FILE as DISTILL_HISTORY
from medtpe.training.token_distillation import DistillResult, distill, summary

TOKENIZER_DIR = "tokenizer"
EXAMPLES_DIR = "examples"
WINDOWS_FILE = "windows.json"
GATE_WINDOWS = "gate"
MINING_LABELS_FILE = "mining-labels.parquet"
DISTILL_RUNS = ("distill", "distill-long")
"""The distillation's run directories under `runs/`: the snippets' stage, the long windows'."""


class FidelityGateError(RuntimeError):
    """The MedTPE model does not answer as the original does at a serving budget."""


def gate_model(config: BuildConfig, artefact_dir: Path, export_dir: Path) -> ModelConfig:
    """What the fidelity gate loads: the kept artefact and its export at the largest serving
    budget, on an eager engine with the build's KV cache, seed and `gate_dtype`; every other
    option keeps its declared default (`ModelConfig.from_options`), as in serving."""
    return ModelConfig.from_options(
        model_dir=config.base,
        artefact_dir=artefact_dir,
        export_dir=export_dir,
        codes_dir=config.meds,
        max_input_tokens=max(config.serving_budgets),
        kv_cache_gib=BUILD_KV_CACHE_GIB,  # beside training: smaller than serving's default
        seed=config.seed,  # the build's own seed, recorded in its identity
        enforce_eager=True,  # engine ready in seconds, not minutes, on CPU
        log_stats=False,
        dtype=config.gate_dtype,
    )


def record_rendering(artefact: Path, meds: Path) -> ArtefactBundle:
    """Ship the code descriptions of the MEDS dataset `meds` (those a build of `artefact`
    rendered its text with) in `artefact`, and record them with the renderer's version in its
    manifest: what `write` does, for an artefact built before it did. The merges, rows,
    validated budgets, artefact id and content digest stay as they are."""
    bundle = ArtefactBundle.from_pretrained(artefact)
    rendering = bundle.save_descriptions(read_code_descriptions(meds))
    return bundle.write_manifest(bundle.validated, rendering)


class ArtefactBuild:
    """One build: its settings, base model facts, work directory and state."""

    def __init__(
        self,
        config: BuildConfig,
        restart: bool = False,
        engine_factory: EngineFactory | None = None,
    ):
        self.config = config
        self.engine_factory = engine_factory or start_vllm
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
        identity = config.identity() | {
            "base_tokenizer": self.info.tokenizer_fingerprint,
            "render_version": RENDER_VERSION,  # the text every step reads
            "prompt_layout": DEFAULT_LAYOUT.value,
        }
        if config.init_from is not None:
            identity["init_from_digest"] = content_digest(config.init_from)
        self.state = BuildState(self.work / STATE_FILE, identity)

    def steps(self) -> list[tuple[str, Callable[[], Any]]]:
        """The build's steps in order."""
        ssft = [(f"ssft_{loss}", lambda loss=loss: self.ssft(loss)) for loss in self.config.losses]
        distill = [("distill", self.distill_rows)] if self.config.distill is not None else []
        labels = [("pseudo_label", self.pseudo_label)] if ssft else []
        return [
            ("check", self.check),
            ("split", self.split),
            ("render", self.render),
            ("mine", self.mine),
            *distill,
            *labels,
            *ssft,
            ("pick", self.pick),
            ("measure", self.measure),
            ("gate", self.gate),
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
        """Subjects split (`medtpe.core.meds.subject_split`: the dataset's subject_splits.parquet,
        else `held_out` of them with `seed`); the SSFT windows sampled; the mining corpus's
        label file."""
        config = self.config
        times = prediction_times(config)
        subjects = [s for s, _ in times]
        split = subject_split(config.meds, subjects, config.held_out, config.seed)
        train_subjects, held_subjects = split.train_and_held_out(subjects)
        held = set(held_subjects)
        train_times = [(s, t) for s, t in times if s not in held]
        held_times = [(s, t) for s, t in times if s in held]
        held_windows = assign_tasks(held_times, config.tasks)
        context = model_context_length(config.base)
        # a window's prompt and its answer must fit the model's context, as in serving
        mix = [
            budget if context is None else min(budget, context - config.max_new_tokens)
            for budget in config.window_budgets
        ]
        windows = {
            "train": with_budgets(
                sample(assign_tasks(train_times, config.tasks), config.n_train, config.seed), mix
            ),
            "val": with_budgets(sample(held_windows, config.n_val, config.seed), mix),
            GATE_WINDOWS: sample(held_windows, config.n_gate, config.seed + 1),
        }
        records = {k: [w.to_json() for w in v] for k, v in windows.items()}
        (self.work / WINDOWS_FILE).write_text(json.dumps(records, indent=0))
        write_label_file(self.work / MINING_LABELS_FILE, train_times)
        return {
            "split_source": split.source,
            "train_subjects": train_subjects,
            "held_out_subjects": held_subjects,
            "n_train_times": len(train_times),
            "n_held_out_times": len(held_times),
            "n_train_windows": len(windows["train"]),
            "n_val_windows": len(windows["val"]),
            "n_gate_windows": len(windows[GATE_WINDOWS]),
        }

    def render(self) -> dict[str, Any]:
        """The SSFT windows' prompts at their budgets: train.jsonl, val.jsonl."""
        saved = json.loads((self.work / WINDOWS_FILE).read_text())
        result = {}
        for split in ("train", "val"):
            records = saved[split]
            windows = [PredictionPoint.from_json(r) for r in records]
            lines = render_windows(self.config, windows, self.work / f"{split}.jsonl", split)
            result[f"{split}_tokens_original"] = sum(r["n_tokens_original"] for r in lines)
            result[f"{split}_budgets"] = dict(
                sorted(Counter(str(w.budget) for w in windows).items())
            )
            result[f"{split}_tokens_original_max"] = max(r["n_tokens_original"] for r in lines)
        return result

    def mine(self) -> dict[str, Any]:
        """The MedTPE tokenizer from the training subjects' records at the prediction times
        (with `init_from`: that artefact's merges), with the build's `plain_tail`."""
        config = self.config
        if config.init_from is not None:
            tok = self._save_tokenizer(MedTPETokenizer.load(config.init_from, base=config.base))
            return {
                "artefact_id": tok.artefact_id,
                "n_new_tokens": len(tok.new_tokens),
                "from": str(config.init_from),
                **{k: tok.corpus_stats[k] for k in ("n_records", "n_tokens")},
            }
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
        tok = self._save_tokenizer(tok)
        stats = tok.corpus_stats
        return {
            "artefact_id": tok.artefact_id,
            "n_new_tokens": len(tok.new_tokens),
            "n_records": stats["n_records"],
            "n_tokens": stats["n_tokens"],
            "sample_compression_rate": stats["sample_compression_rate"],
        }

    def _save_tokenizer(self, tok: MedTPETokenizer) -> MedTPETokenizer:
        """`tok` with the build's `plain_tail`, written into the work dir."""
        tok = tok.with_settings(**{PLAIN_TAIL: self.config.plain_tail})
        tok.save(self.work / TOKENIZER_DIR)
        return tok

    def distill_rows(self) -> dict[str, Any]:
        """Token-level distillation of the rows on snippets of the rendered windows (training
        split: training snippets; validation split: held-out ones), then, if asked
        (`DistillConfig.long_tokens`), on long windows of them from the snippets' best rows; in
        its own copy of the tokenizer artefact (each stage resumes from its run directory)."""
        from medtpe.training.export import base_model_fingerprint, load_rows_file, save_rows

        config, settings = self.config, self.config.distill
        tokenizer = MedTPETokenizer.load(self.work / TOKENIZER_DIR)
        encoded = {
            split: [tokenizer.base_encode(p, special_tokens=True) for p in self._prompts(split)]
            for split in ("train", "val")
        }
        from_artefact = settings.start == "init_from" and config.init_from is not None
        initial = load_rows_file(config.init_from / ROWS_FILE)[0] if from_artefact else None
        result, record = self._distill_stage(tokenizer, encoded, settings, initial, DISTILL_RUNS[0])
        long = long_stage(settings)
        if long is not None:
            longer = {
                split: [ids for ids in prompts if len(ids) >= long.snippet_tokens]
                for split, prompts in encoded.items()
            }
            last = settings.long_windows == "last"
            result, record["long"] = self._distill_stage(
                tokenizer, longer, long, result.rows, DISTILL_RUNS[1], last_windows=last
            )
        artefact = self.work / "artefact-distill"
        if not artefact.is_dir():
            shutil.copytree(self.work / TOKENIZER_DIR, artefact)
        save_rows(artefact, result.rows, base_model_fingerprint(config.base))
        return record

    def _distill_stage(
        self,
        tokenizer: MedTPETokenizer,
        encoded: dict[str, list[list[int]]],
        settings: DistillConfig,
        initial: NewRows | None,
        run: str,
        *,
        last_windows: bool = False,
    ) -> tuple[DistillResult, dict[str, Any]]:
        """One distillation over snippets of `settings.snippet_tokens` cut from the `encoded`
        prompts (led by the chat template's opening; a prompt's last snippet ends at its
        answer position), resumed from `runs/<run>`; its result and record. The snippets are
        merged throughout and drawn (`medtpe.core.tokenizer.snippets.draw`): they train rows, which
        a plain tail never holds; with `last_windows`, each prompt's last window in the
        artefact's own encoding (its plain tail unmerged, as served), the first ones in order."""
        from medtpe.core.tokenizer.snippets import coverage, cut, draw, opening

        length, seed = settings.snippet_tokens, self.config.seed
        tail = None if last_windows else 0
        pools = {
            split: [
                s
                for ids in prompts
                for s in cut(
                    tokenizer, ids, length, opening(tokenizer, ids), tail=True, unmerged_tail=tail
                )[-1 if last_windows else 0 :]
            ]
            for split, prompts in encoded.items()
        }
        if last_windows:
            train, val = pools["train"][: settings.snippets], pools["val"][: settings.val_snippets]
        else:
            train = draw(tokenizer, pools["train"], settings.snippets, settings.min_contexts, seed)
            val = draw(tokenizer, pools["val"], settings.val_snippets, 0, seed + 1)
        result = distill(
            self.config.base,
            tokenizer,
            train,
            val,
            self.work / "runs" / run,
            settings,
            initial,
            seed=seed,
            device=self.config.device,
        )
        return result, summary(result, settings) | {
            "coverage": {"train": coverage(tokenizer, train), "val": coverage(tokenizer, val)},
            "pool": {split: len(pool) for split, pool in pools.items()},
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
        splits = {s: (self._examples_file(s), self._prompts(s)) for s in ("train", "val")}
        by_split = cached_examples(
            splits, self.config.base, tokenizer, self.config.max_new_tokens, self.info.eos_ids[0]
        )
        result = {}
        for split, examples in by_split.items():
            ended = sum(bool(e.response) and e.response[-1] in self.info.eos_ids for e in examples)
            result[split] = {
                "n": len(examples),
                "n_ended_by_eos": ended,
                "n_ended_by_answer_end": sum(
                    bool(e.response) and ANSWER_END in tokenizer.base.decode(e.response[-1:])
                    for e in examples
                ),
                "tokens_original_max": max((len(e.teacher) for e in examples), default=0),
            }
        return result

    def ssft(self, loss: str) -> dict[str, Any]:
        """SSFT with `loss` in its own copy of the tokenizer artefact (resumes a checkpoint)."""
        from medtpe.training.ssft_pipeline import run_ssft

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
            batch_size=config.batch_size,
            grad_accum=config.grad_accum,
            init_rows=self._ssft_init(),
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

    def _ssft_init(self) -> Path | None:
        """The rows SSFT starts from: the distilled rows, else `init_from`'s, else None (the
        constituents' mean)."""
        if self.config.distill is not None:
            return self.work / "artefact-distill" / ROWS_FILE
        return self.config.init_from / ROWS_FILE if self.config.init_from else None

    def pick(self) -> dict[str, Any]:
        """The loss whose rows are closest to the original model on held-out windows (lowest
        held-out KL of the answer distributions; every run measures it, whatever it trains);
        without SSFT, the distilled rows."""
        if not self.config.losses:
            return {"loss": "distill", "best_val": self.state.result("distill")["best_val_loss"]}
        losses = {loss: self.state.result(f"ssft_{loss}") for loss in self.config.losses}
        best = min(losses, key=lambda loss: losses[loss]["best_val"]["kl"])
        return {"loss": best, "best_val": losses[best]["best_val"]}

    def _kept(self) -> Path:
        return self.work / f"artefact-{self.state.result('pick')['loss']}"

    def measure(self) -> dict[str, Any]:
        """Held-out compression of the kept artefact."""
        tokenizer = MedTPETokenizer.load(self._kept())
        records = read_records(self.work / "val.jsonl")
        prompts, texts = [r["prompt"] for r in records], [r["text"] for r in records]
        return {"compression": compression(tokenizer, prompts, texts)}

    def gate(self) -> dict[str, Any]:
        """The fidelity gate: held-out windows answered in both modes at every serving budget
        (`medtpe.training.fidelity_gate`); the figures and each budget's failures (checked again
        against the thresholds when the build writes)."""
        from medtpe.training.fidelity_gate import gate_records, run_gate

        config = self.config
        saved = json.loads((self.work / WINDOWS_FILE).read_text())
        windows = [PredictionPoint.from_json(r) for r in saved[GATE_WINDOWS]]
        return run_gate(
            gate_model(config, self._kept(), self.work / "export"),
            gate_records(config.meds, windows),
            config.serving_budgets,
            self.thresholds,
            self.engine_factory,
        )

    @property
    def thresholds(self) -> Thresholds:
        """The gate's thresholds of these settings."""
        return Thresholds(self.config.min_same_answer, self.config.max_delta_p_mean)

    def _check_gate(self) -> dict[str, Any]:
        """Each serving budget's fidelity held to the current thresholds; `FidelityGateError`
        (naming the failures and the work dir that keeps the figures) when one fails."""
        gate = self.state.result("gate")
        failures = {
            budget: self.thresholds.check(result["fidelity"]) for budget, result in gate.items()
        }
        failed = {budget: why for budget, why in failures.items() if why}
        if failed:
            detail = "; ".join(f"at {b} tokens: {', '.join(why)}" for b, why in failed.items())
            raise FidelityGateError(
                f"fidelity gate failed ({detail}); nothing was written to {self.config.out}; "
                f"the figures are in {self.work / STATE_FILE}"
            )
        return gate

    def write(self) -> dict[str, Any]:
        """After the gate passed: the kept artefact's files, the SSFT curves, the code
        descriptions the text was rendered with, the report and the manifest (the budgets it was
        validated at, the rendering) into the output dir."""
        gate = self._check_gate()
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        # an earlier artefact's manifest there vouches for files about to be replaced
        (out / MANIFEST_FILE).unlink(missing_ok=True)
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
        for run in DISTILL_RUNS if self.config.distill is not None else ():
            history = self.work / "runs" / run / DISTILL_HISTORY
            if history.is_file():  # the long windows' stage only where it was asked for
                name = DISTILL_HISTORY.replace("distill", run, 1)
                shutil.copyfile(history, out / name)
                written.append(name)
        descriptions = read_code_descriptions(self.config.meds)
        rendering = ArtefactBundle.from_pretrained(out).save_descriptions(descriptions)
        written += [DESCRIPTIONS_FILE] if descriptions else []
        written += [REPORT_FILE, MANIFEST_FILE]
        (out / REPORT_FILE).write_text(json.dumps(self.report(written), indent=2) + "\n")
        validated = {int(budget): result["fidelity"] for budget, result in gate.items()}
        ArtefactBundle.from_pretrained(out).write_manifest(validated, rendering)
        return {"files": written}

    def report(self, files: list[str] | None = None) -> dict[str, Any]:
        """The build report: settings, base model, every step's result and time."""
        steps = self.state.steps
        ssft = {loss: steps[f"ssft_{loss}"]["result"] for loss in self.config.losses}
        distilled = steps["distill"]["result"] if "distill" in steps else None
        return {
            "artefact_id": steps["mine"]["result"]["artefact_id"],
            "out": str(self.config.out),
            "base": steps["check"]["result"],
            "settings": to_dict(self.config),
            "split": {k: v for k, v in steps["split"]["result"].items() if "subjects" not in k},
            "render": steps["render"]["result"],
            "mine": steps["mine"]["result"],
            "distill": distilled,
            "pseudo_label": steps["pseudo_label"]["result"] if "pseudo_label" in steps else None,
            "ssft": ssft,
            "pick": steps["pick"]["result"],
            "measure": steps["measure"]["result"],
            "gate": steps["gate"]["result"],
            "held_out_subjects": steps["split"]["result"]["held_out_subjects"],
            "files": files or steps.get("write", {}).get("result", {}).get("files", []),
            "step_seconds": {name: step["seconds"] for name, step in steps.items()},
            "seconds": sum(step["seconds"] for step in steps.values()),
        }
