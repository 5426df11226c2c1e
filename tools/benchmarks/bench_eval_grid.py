"""F1 and FCR vs input budget (the paper's context-length robustness) and majority voting with
n = 1, 3, 5 (test-time scaling), original vs MedTPE, through `medtpe evaluate`'s code.

One engine per mode serves the whole grid (`medtpe.evaluation.settings_sweep`; prefix caching off,
one record at a time); each grid point gets that mode's `Predictor` at the point's input budget in
ORIGINAL tokens, so both modes see the same text at every point. Points are `BUDGET:LIMIT` (the
first LIMIT records); voting points run at `--vote-budget` with temperature `--vote-temperature`.

    .venv/bin/python -m tools.benchmarks.bench_eval_grid --subjects 10002428,10003046,... \\
        --modes original,medtpe --out tools/benchmarks/results/eval_grid_v2.json

`--modes original` and `--modes medtpe` may run at different times into different files; the
`--merge` form joins them (later files' points replace earlier ones) and draws the plots:

    .venv/bin/python -m tools.benchmarks.bench_eval_grid --merge A.json B.json \\
        --out tools/benchmarks/results/eval_grid_v2.json --plot-dir docs/img
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe.core.tasks import get_task
from medtpe.evaluation.figures import build_report
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import load_records
from medtpe.evaluation.runner import measured
from medtpe.evaluation.settings_sweep import EvalSetting, evaluate_settings
from medtpe.inference.engines.protocol import EngineOptions
from medtpe.inference.model import ModelConfig, load_model
from medtpe.inference.sampling import Sampling
from medtpe.training.export import prepare_model_files

SHARED_MEDS = Path("../shared/data/mimic-iv-demo-meds")
MAX_NEW_TOKENS = 64


def grid_points(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The budget sweep (greedy, one sample) and the voting points."""
    points = []
    for spec in filter(None, args.budgets.split(",")):
        budget, limit = (int(x) for x in spec.split(":"))
        points.append({"name": f"budget-{budget}", "budget": budget, "limit": limit, "n": 1})
    for n in (int(x) for x in args.votes.split(",") if x):
        points.append(
            {
                "name": f"vote-{n}",
                "budget": args.vote_budget,
                "limit": args.vote_limit,
                "n": n,
                "temperature": args.vote_temperature,
            }
        )
    return points


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the grid for the requested modes, every point of a mode on one engine; per point and
    mode, the report's summary (the JSON is rewritten after every point, so an interrupted run
    keeps what it finished)."""
    task = get_task(args.task)
    subjects = {int(s) for s in args.subjects.split(",")} if args.subjects else None
    records = load_records(args.meds, args.labels, task, subjects=subjects)
    points = grid_points(args)
    settings = [
        EvalSetting(
            name=point["name"],
            task=task,
            records=records[: point["limit"]],
            sampling=Sampling(point["n"], point.get("temperature", 0.0), MAX_NEW_TOKENS),
            max_input_tokens=point["budget"],
        )
        for point in points
    ]
    out: dict[str, Any] = {"task": task.name, "points": points, "modes": {}}
    for mode in args.modes.split(","):
        config = ModelConfig(
            model_dir=default_model_dir(),
            artefact_dir=args.artefact or default_artefact_dir(),
            export_dir=args.export_dir or default_export_dir(),
            mode=mode,
            codes_dir=args.meds,
            max_input_tokens=max(point["budget"] for point in points),
            max_new_tokens=MAX_NEW_TOKENS,
            engine=EngineOptions(kv_cache_gib=2.0, seed=1),
        )
        prepare_model_files(config)
        by_point = out["modes"].setdefault(mode, {})

        def save(
            setting: EvalSetting,
            rows: list[RecordResult],
            by_point: dict = by_point,
            mode: str = mode,
        ) -> None:
            by_point[setting.name] = build_report(task, {mode: rows}, settings={}).to_json()
            args.out.write_text(json.dumps(out, indent=2) + "\n")

        asyncio.run(evaluate_settings(load_model(measured(config)), settings, save))
    return out


def merge(paths: list[Path]) -> dict[str, Any]:
    """Join grid files point by point (same task; a later file's point replaces an earlier one)."""
    parts = [json.loads(path.read_text()) for path in paths]
    points: dict[str, dict[str, Any]] = {}
    modes: dict[str, dict[str, Any]] = {}
    for part in parts:
        points.update((point["name"], point) for point in part["points"])
        for mode, by_point in part["modes"].items():
            modes.setdefault(mode, {}).update(by_point)
    return {"task": parts[0]["task"], "points": list(points.values()), "modes": modes}


def figure(value: float | dict[str, Any]) -> float:
    """A report figure's value (reports since issue 15 give F1 as {value, low, high, ...})."""
    return value["value"] if isinstance(value, dict) else value


def plot(grid: dict[str, Any], plot_dir: Path) -> None:
    """eval_budget.png (F1, FCR, latency vs budget) and eval_voting.png (the same vs n); each
    mode over the points it ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget_points = [p for p in grid["points"] if p["name"].startswith("budget-")]
    vote_points = [p for p in grid["points"] if p["name"].startswith("vote-")]
    panels = (("f1", "F1"), ("fcr", "FCR"), ("latency_s_mean", "latency per record (s)"))
    for file, points, x_key, x_label, keys in (
        ("eval_budget.png", budget_points, "budget", "input budget (original tokens)", panels),
        ("eval_voting.png", vote_points, "n", "samples n (majority vote)", panels),
    ):
        fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6))
        for ax, (key, label) in zip(axes, keys, strict=True):
            for mode, by_point in grid["modes"].items():
                ran = [p for p in points if p["name"] in by_point]
                xs = [p[x_key] for p in ran]
                ys = [figure(by_point[p["name"]][mode][key]) for p in ran]
                ax.plot(xs, ys, marker="o", label=mode)
            if x_key == "budget":
                ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0, top=1.05 if key == "fcr" else None)
            ax.set_xlabel(x_label)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        plot_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot_dir / file, dpi=120)


def main() -> None:
    """Run (or merge) the grid, write the JSON and, with --plot-dir, the plots."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, default=SHARED_MEDS)
    parser.add_argument("--labels", type=Path, default=None)
    parser.add_argument("--task", default="icu_mortality")
    parser.add_argument("--subjects", default=None, help="comma-separated subject ids")
    parser.add_argument("--modes", default="original,medtpe")
    parser.add_argument("--budgets", default="512:22,1024:22,2048:16,4096:8,8128:6")
    parser.add_argument("--votes", default="1,3,5")
    parser.add_argument("--vote-budget", type=int, default=1024)
    parser.add_argument("--vote-limit", type=int, default=22)
    parser.add_argument("--vote-temperature", type=float, default=0.7)
    parser.add_argument("--artefact", type=Path, default=None)
    parser.add_argument("--export-dir", type=Path, default=None)
    parser.add_argument("--merge", type=Path, nargs="+", default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot-dir", type=Path, default=None)
    args = parser.parse_args()
    args.labels = args.labels or args.meds / "labels" / f"{args.task}.parquet"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    grid = merge(args.merge) if args.merge else run(args)
    args.out.write_text(json.dumps(grid, indent=2) + "\n")
    if args.plot_dir:
        plot(grid, args.plot_dir)


if __name__ == "__main__":
    main()
