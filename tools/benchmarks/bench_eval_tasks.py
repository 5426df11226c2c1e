"""Table 2 for all four tasks: labels derived from a MEDS dataset (`medtpe labels`' code), a
small subset of records per task, both modes, four decoding settings, and meds-evaluation's own
scores of each mode's predictions file.

Settings: the service's (answer prefill, greedy), the paper's (no prefill, temperature 0.7, one
sample), each free and constrained (vLLM structured outputs). One engine per mode serves every
task and setting (`medtpe.evaluation.settings_sweep`; prefix caching off, one record at a time, same
prompts in both modes).

    nice -n 10 .venv/bin/python -m tools.benchmarks.bench_eval_tasks --per-task 4 --budget 1024 \\
        --settings service_constrained,paper_free,paper_constrained \\
        --out tools/benchmarks/results/eval_tasks.json

The JSON is rewritten after every (mode, task, setting), so an interrupted run keeps its part.
The modes may run as two processes at once (`--modes original` and `--modes medtpe` into two
files, same `--predictions-dir`), joined afterwards into both-mode reports:

    .venv/bin/python -m tools.benchmarks.bench_eval_tasks --merge A.json B.json \\
        --predictions-dir DIR --out tools/benchmarks/results/eval_tasks.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medtpe.core.meds import MedsDataset
from medtpe.core.meds.labels import LABEL_FUNCTIONS, derive_labels, write_labels
from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe.core.tasks import Task, get_task
from medtpe.evaluation.external_scores import meds_evaluation_scores
from medtpe.evaluation.figures import build_report, with_interval
from medtpe.evaluation.predictions import write_predictions
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord, load_records
from medtpe.evaluation.runner import measured
from medtpe.evaluation.settings_sweep import EvalSetting, evaluate_settings
from medtpe.evaluation.stored_report import stored_results
from medtpe.inference.engines.protocol import EngineOptions
from medtpe.inference.model import ModelConfig, load_model
from medtpe.inference.sampling import Sampling
from medtpe.training.export import prepare_model_files

SHARED_MEDS = Path("../shared/data/mimic-iv-demo-meds")
MODES = ("original", "medtpe")
SETTINGS = {
    "service_free": {"prefill": True, "temperature": 0.0, "constrained": False},
    "service_constrained": {"prefill": True, "temperature": 0.0, "constrained": True},
    "paper_free": {"prefill": False, "temperature": 0.7, "constrained": False},
    "paper_constrained": {"prefill": False, "temperature": 0.7, "constrained": True},
}
"""Decoding settings: the service's (prefill, greedy) and the paper's (no prefill, T 0.7)."""


def subset(records: list[EvalRecord], task: Task, size: int) -> list[EvalRecord]:
    """Up to `size` records: for binary tasks the positives first (at most half), then
    negatives, each in label-file order; other tasks the first `size`."""
    if task.label_type != "binary":
        return records[:size]
    positives = [r for r in records if r.label][: size // 2]
    negatives = [r for r in records if not r.label][: size - len(positives)]
    return positives + negatives


def task_records(
    meds: Path, label_dir: Path, size: int
) -> tuple[dict[str, list[EvalRecord]], dict[str, dict[str, int]]]:
    """Each task's label file (derived here), its subset of records and the label file's counts
    (rows, subjects, rows with a positive label)."""
    dataset = MedsDataset.load(meds)
    chosen, counts = {}, {}
    for name in LABEL_FUNCTIONS:
        task = get_task(name)
        path = label_dir / f"{name}.labels.parquet"
        rows = derive_labels(dataset, task)
        write_labels(rows, task, path)
        records = load_records(meds, path, task)
        chosen[name] = subset(records, task, size)
        counts[name] = {
            "rows": len(rows),
            "subjects": len({r.subject_id for r in rows}),
            "positive_rows": sum(bool(r.label) for r in records),
        }
    return chosen, counts


async def run_mode(
    mode: str,
    config: ModelConfig,
    chosen: dict[str, list[EvalRecord]],
    settings: list[str],
    results: dict[str, dict[str, dict[str, list[RecordResult]]]],
    save: Callable[[], None],
) -> None:
    """Every task and setting of one mode on one engine (every task of a setting first: a cut
    run keeps whole settings)."""
    prepare_model_files(config)
    points = [
        EvalSetting(
            name=setting,
            task=get_task(name).model_copy(update={"prefill_answer": spec["prefill"]}),
            records=records,
            sampling=Sampling(
                1, spec["temperature"], config.max_new_tokens, constrained=spec["constrained"]
            ),
        )
        for setting in settings
        for spec in [SETTINGS[setting]]
        for name, records in chosen.items()
    ]

    def keep(point: EvalSetting, rows: list[RecordResult]) -> None:
        results.setdefault(point.task.name, {}).setdefault(point.name, {})[mode] = rows
        save()

    await evaluate_settings(load_model(measured(config)), points, keep)


def reports(
    out: dict[str, Any],
    results: dict[str, dict[str, dict[str, list[RecordResult]]]],
    chosen: dict[str, list[EvalRecord]],
    predictions_dir: Path,
) -> None:
    """`out["tasks"][task][setting]`: the report over the modes that ran and, for binary tasks,
    each mode's predictions file scored by meds-evaluation."""
    for name, by_setting in results.items():
        for setting, by_mode in by_setting.items():
            task = get_task(name).model_copy(
                update={"prefill_answer": SETTINGS[setting]["prefill"]}
            )
            report = build_report(task, by_mode, settings={"setting": setting}).to_json()
            entry = out["tasks"].setdefault(name, {})[setting] = report
            if task.label_type != "binary":
                continue
            for mode, rows in by_mode.items():
                path = predictions_dir / name / f"{setting}.{mode}.parquet"
                write_predictions(task, chosen[name], rows, path)
                entry.setdefault("meds_evaluation", {})[mode] = meds_evaluation_scores(path)


def merge(paths: list[Path], meds: Path, predictions_dir: Path) -> dict[str, Any]:
    """Join runs of different modes (same records) into both-mode reports."""
    parts = [json.loads(path.read_text()) for path in paths]
    out = {k: v for k, v in parts[0].items() if k != "tasks"} | {"tasks": {}}
    out["merged_from"] = [str(path) for path in paths]
    results: dict[str, dict[str, dict[str, list[RecordResult]]]] = {}
    for part in parts:
        for name, by_setting in part["tasks"].items():
            for setting, report in by_setting.items():
                by_mode = results.setdefault(name, {}).setdefault(setting, {})
                by_mode.update(stored_results(report))
    chosen = {}
    for name, keys in out["records"].items():
        task = get_task(name)
        by_key = {
            r.key: r for r in load_records(meds, predictions_dir / f"{name}.labels.parquet", task)
        }
        chosen[name] = [by_key[key] for key in keys]
    reports(out, results, chosen, predictions_dir)
    return out


def markdown_tables(out: dict[str, Any]) -> str:
    """The Table-2 rows (one per task, setting and mode) and the meds-evaluation rows."""
    lines = [
        "| task | setting | mode | FCR | F1 | AUROC | AUPRC | Brier | ECE | tokens | latency s "
        "| CR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    scored = [
        "| task | setting | mode | meds-evaluation AUROC | AUPRC | Brier | calibration error "
        "| F1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    deltas = [
        "| task | setting | ΔF1 | ΔAUROC | ΔAUPRC | same answer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, by_setting in out["tasks"].items():
        for setting, report in by_setting.items():
            for mode in MODES:
                if mode not in report:
                    continue
                row = report[mode]
                cr = f"{row['compression_rate']:.1%}" if "compression_rate" in row else "–"
                quality = " | ".join(
                    with_interval(row.get(key), ".2f")
                    for key in ("f1", "auroc", "auprc", "brier", "ece")
                )
                lines.append(
                    f"| {name} | {setting} | {mode} | {row['fcr']:.0%} | {quality} | "
                    f"{row['tokens_mean']:.0f} | {row['latency_s_mean']:.1f} | {cr} |"
                )
                evaluated = report.get("meds_evaluation", {}).get(mode)
                if evaluated is not None:
                    figures = evaluated.get("samples_equally_weighted", {})
                    names = (
                        "roc_auc_score",
                        "average_precision_score",
                        "brier_score",
                        "calibration_error",
                        "f1_score",
                    )
                    cells = " | ".join(
                        f"{figures[k]:.3f}" if k in figures else evaluated.get("error", "–")[:40]
                        for k in names
                    )
                    scored.append(f"| {name} | {setting} | {mode} | {cells} |")
            if "agreement" in report:
                changes = " | ".join(
                    with_interval(report.get(key), "+.2f")
                    for key in ("delta_f1", "delta_auroc", "delta_auprc")
                )
                deltas.append(f"| {name} | {setting} | {changes} | {report['agreement']:.0%} |")
    return "\n".join([*lines, "", *deltas, "", *scored]) + "\n"


def main() -> None:
    """Derive labels, run both modes over every task and setting, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, default=SHARED_MEDS)
    parser.add_argument("--per-task", type=int, default=10)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--merge", type=Path, nargs="+", default=None)
    parser.add_argument("--predictions-dir", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="print a results file's tables")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.table:
        print(markdown_tables(json.loads(args.table.read_text())))
        return
    predictions_dir = args.predictions_dir or Path(tempfile.mkdtemp(prefix="bench_eval_tasks_"))
    if args.merge:
        merged = merge(args.merge, args.meds, predictions_dir)
        args.out.write_text(json.dumps(merged, indent=2) + "\n")
        return
    settings = args.settings.split(",")
    chosen, counts = task_records(args.meds, predictions_dir, args.per_task)
    results: dict[str, dict[str, dict[str, list[RecordResult]]]] = {}
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "meds": str(args.meds),
        "budget_original_tokens": args.budget,
        "max_new_tokens": args.max_new_tokens,
        "enforce_eager": args.enforce_eager,
        "per_task": args.per_task,
        "settings": {name: SETTINGS[name] for name in settings},
        "label_files": counts,
        "records": {name: [r.key for r in records] for name, records in chosen.items()},
        "tasks": {},
    }

    def save() -> None:
        reports(out, results, chosen, predictions_dir)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")

    for mode in args.modes.split(","):
        config = ModelConfig(
            model_dir=default_model_dir(),
            artefact_dir=default_artefact_dir(),
            export_dir=default_export_dir(),
            mode=mode,
            codes_dir=args.meds,
            max_input_tokens=args.budget,
            max_new_tokens=args.max_new_tokens,
            engine=EngineOptions(kv_cache_gib=1.0, seed=1, enforce_eager=args.enforce_eager),
        )
        asyncio.run(run_mode(mode, config, chosen, settings, results, save))
    save()


if __name__ == "__main__":
    main()
