"""Re-scoring a growing record: sliding vs stable window, prompts and the engine's prefix cache.

Every ICU stay of the label file is re-scored hourly over the last `--hours` hours before its
prediction time, at each budget, under both window policies (`medtpe.core.prompt.windowing`):

- prompts (all stays, no engine): events kept by each policy (the price of stability) and the
  share of each re-score's MedTPE prompt that repeats the previous hour's prompt token for token
  (what the prefix cache can serve);
- engine (the first `--engine-stays` stays per budget; the real vLLM engine, MedTPE mode): each
  re-score generated after the previous hour's (its cache salt shared with them, a warm chain)
  and again cold (a fresh salt, nothing cached for it); the median generate time of warm vs
  cold, the prefix-cache hit rate from vLLM's own `vllm:prefix_cache_*` counters, and answers
  and p(yes) of the stable window against the sliding one.

`--prompt-layout task-first.v1` builds the prompts in the other layout (the prompts' figures of
both layouts side by side: run it once each without `--engine-stays`).

    nice -n 10 .venv/bin/python -m tools.benchmarks.bench_rescore \
        --meds ../shared/data/mimic-iv-demo-meds --engine-stays 4096=4 --engine-stays 8192=1 \
        --out tools/benchmarks/results/rescore.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from tqdm import tqdm

from medtpe.core.meds import MedsDataset, SubjectEvents, read_labels
from medtpe.core.prompt.layout import PromptLayout
from medtpe.core.prompt.windowing import DEFAULT_GRID_HOURS, Windowing, WindowPolicy
from medtpe.core.tasks import get_task
from medtpe.inference.engines.protocol import EngineOptions
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Predictor, PreparedRecord
from medtpe.inference.sampling import Sampling
from medtpe.training.export import prepare_model_files
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"
PREFIX_CACHE_METRICS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
RESCORE = Sampling(max_new_tokens=8)
"""One greedy answer of at most 8 tokens, p(yes) asked for."""


def rescore_times(prediction_time: datetime, hours: int) -> list[datetime]:
    """Hourly prediction times ending at `prediction_time`, `hours` re-scores after the first."""
    return [prediction_time - timedelta(hours=hours - k) for k in range(hours + 1)]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def predictors(
    loaded: LoadedModel, budget: int, grid_hours: int, layout: PromptLayout | None = None
) -> dict[str, Predictor]:
    """One predictor per policy at `budget`, sharing the loaded tokenizer, in `layout` (None:
    the default one)."""
    base = loaded.predictor
    out = {
        policy.value: Predictor(
            base.tokenizer,
            base.chat_template,
            base.mode,
            budget,
            base.descriptions,
            windowing=Windowing(policy, grid_hours),
        )
        for policy in WindowPolicy
    }
    return {k: v.with_layout(layout) for k, v in out.items()} if layout else out


def prepare_stay(
    predictor: Predictor, events: SubjectEvents, times: list[datetime]
) -> list[PreparedRecord]:
    """The stay's prompts at each re-score time."""
    task = get_task(TASK)
    return [predictor.prepare(task, events, t) for t in times]  # type: ignore[arg-type]


def prompt_figures(chains: list[list[PreparedRecord]]) -> dict[str, Any]:
    """Events kept and the share of each re-score's prompt repeating the previous one."""
    kept = [r.prompt.n_events_kept for chain in chains for r in chain]
    pairs = [pair for chain in chains for pair in itertools.pairwise(chain)]
    common = [common_prefix(prev.ids("medtpe"), cur.ids("medtpe")) for prev, cur in pairs]
    shared = [n / len(cur.ids("medtpe")) for n, (_, cur) in zip(common, pairs, strict=True)]
    not_reused = [len(prev.ids("medtpe")) - n for n, (prev, _) in zip(common, pairs, strict=True)]
    truncated = [
        r.prompt.n_events_kept < r.prompt.n_events_total for chain in chains for r in chain
    ]
    return {
        "events_kept_total": sum(kept),
        "prompts": len(kept),
        "truncated_prompts": sum(truncated),
        "shared_prefix_share_median": round(statistics.median(shared), 4),
        "shared_prefix_share_mean": round(statistics.mean(shared), 4),
        "rescores_sharing_90pct": sum(s >= 0.9 for s in shared),
        "previous_ids_not_reused_median": statistics.median(not_reused),
        "rescores": len(shared),
    }


def prefix_cache_counters() -> tuple[float, float]:
    """vLLM's cumulative (queries, hits) prefix-cache token counters in this process."""
    values = dict.fromkeys(PREFIX_CACHE_METRICS, 0.0)
    for family in REGISTRY.collect():
        if family.name in values:
            values[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return values[PREFIX_CACHE_METRICS[0]], values[PREFIX_CACHE_METRICS[1]]


def grid_sweep(
    loaded: LoadedModel, budget: int, grids: list[int], stays: list[tuple[SubjectEvents, datetime]]
) -> dict[str, float]:
    """Events kept by the stable window on each grid relative to the sliding one, summed over
    `stays` at their prediction times."""
    task = get_task(TASK)
    base = predictors(loaded, budget, grids[0])["sliding"]
    sliding = sum(base.prepare(task, ev, t).prompt.n_events_kept for ev, t in stays)  # type: ignore[arg-type]
    out = {}
    for grid in tqdm(grids, desc=f"grid sweep {budget}", file=sys.stdout):
        stable = predictors(loaded, budget, grid)["stable"]
        kept = sum(stable.prepare(task, ev, t).prompt.n_events_kept for ev, t in stays)  # type: ignore[arg-type]
        out[str(grid)] = round(kept / sliding, 4)
    return out


async def run_chain(
    engine: Any, predictor: Predictor, chain: list[PreparedRecord]
) -> list[dict[str, Any]]:
    """The stay's re-scores in order under one salt (warm), each also under a fresh salt (cold)."""
    salt = uuid.uuid4().hex
    rows = []
    for i, record in enumerate(chain):
        before = prefix_cache_counters()
        warm = await predictor.answer(engine, record, RESCORE, cache_salt=salt)
        after = prefix_cache_counters()
        row = {
            "hour": i,
            "prompt_tokens": len(record.ids(predictor.mode)),
            "events_kept": record.prompt.n_events_kept,
            "warm_s": round(warm.generate_s, 3),
            "answer": warm.prediction,
            "p_yes": (warm.probabilities or {}).get("yes"),
            "cache_queries": after[0] - before[0],
            "cache_hits": after[1] - before[1],
        }
        if i:  # a re-score: the same record cold, for comparison
            cold = await predictor.answer(engine, record, RESCORE, cache_salt=uuid.uuid4().hex)
            row["cold_s"] = round(cold.generate_s, 3)
        rows.append(row)
    return rows


def engine_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median warm re-score and cold times, their ratio, and the prefix-cache hit rate."""
    rescored = [r for r in rows if r["hour"] > 0]
    warm = statistics.median(r["warm_s"] for r in rescored)
    cold = statistics.median(r["cold_s"] for r in rescored)
    ratios = [r["warm_s"] / r["cold_s"] for r in rescored]
    queries = sum(r["cache_queries"] for r in rescored)
    hits = sum(r["cache_hits"] for r in rescored)
    return {
        "rescores": len(rescored),
        "median_rescore_s": round(warm, 3),
        "median_cold_s": round(cold, 3),
        "median_rescore_over_cold": round(statistics.median(ratios), 3),
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
    }


def agreement(sliding: list[dict[str, Any]], stable: list[dict[str, Any]]) -> dict[str, Any]:
    """Answers and p(yes) of the stable window against the sliding one, record by record."""
    pairs = list(zip(sliding, stable, strict=True))
    dp = [
        abs(a["p_yes"] - b["p_yes"])
        for a, b in pairs
        if a["p_yes"] is not None and b["p_yes"] is not None
    ]
    return {
        "records": len(pairs),
        "answer_agreement": round(
            sum(a["answer"] == b["answer"] for a, b in pairs) / len(pairs), 4
        ),
        "mean_abs_dp_yes": round(statistics.mean(dp), 4) if dp else None,
    }


async def engine_phase(
    loaded: LoadedModel,
    chains: dict[str, dict[str, list[list[PreparedRecord]]]],
    out: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """Run each budget's chains on one engine; `out[budget]` is summarised (and saved) after
    every stay, so a run cut short keeps what it measured."""
    from medtpe.inference.engines.vllm_engine import VllmEngine

    engine = await asyncio.to_thread(VllmEngine.start, loaded.engine_config)
    try:
        first = next(iter(next(iter(chains.values())).values()))[0][0]
        await engine.warm_up(first.ids(loaded.predictor.mode))
        for budget, by_policy in chains.items():
            rows: dict[str, list[dict[str, Any]]] = {policy: [] for policy in by_policy}
            n_stays = len(next(iter(by_policy.values())))
            for i in tqdm(range(n_stays), desc=f"engine {budget}", file=sys.stdout):
                for policy, stay_chains in by_policy.items():
                    rows[policy].extend(await run_chain(engine, loaded.predictor, stay_chains[i]))
                out[budget] = {
                    "stays": i + 1,
                    **{policy: engine_figures(r) for policy, r in rows.items()},
                    "stable_vs_sliding": agreement(rows["sliding"], rows["stable"]),
                    "rows": rows,
                }
                save()
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--budget", type=int, action="append", help="default: 8192 and 4096")
    parser.add_argument("--hours", type=int, default=6, help="re-scores per stay (hourly)")
    parser.add_argument("--grid-hours", type=int, default=DEFAULT_GRID_HOURS)
    parser.add_argument("--stays", type=int, help="only the first N stays (default: all)")
    parser.add_argument(
        "--engine-stays",
        action="append",
        default=[],
        metavar="BUDGET=N",
        help="run the first N stays of BUDGET on the engine (default: none)",
    )
    parser.add_argument(
        "--sweep-grids",
        help="comma-separated grid hours: events kept by the stable window on each grid vs the "
        "sliding one, at the prediction time of the first --sweep-stays stays (nothing else runs)",
    )
    parser.add_argument("--sweep-stays", type=int, default=30)
    parser.add_argument(
        "--prompt-layout",
        choices=[layout.value for layout in PromptLayout],
        help="the prompts' layout (default: the service's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    budgets = args.budget or [8192, 4096]
    engine_stays = {int(k): int(v) for k, v in (item.split("=") for item in args.engine_stays)}

    config = ModelConfig(
        codes_dir=args.meds,
        max_input_tokens=max(budgets),
        engine=EngineOptions(max_num_seqs=1, kv_cache_gib=1.0, log_stats=True),
    )
    prepare_model_files(config)
    loaded = load_model(config)
    dataset = MedsDataset.load(args.meds)
    rows = read_labels(args.meds / "labels" / f"{TASK}.parquet")[: args.stays]
    if args.sweep_grids:
        grids = [int(g) for g in args.sweep_grids.split(",")]
        stays = [
            (dataset.events(r.subject_id), r.prediction_time) for r in rows[: args.sweep_stays]
        ]
        sweep = {
            str(budget): grid_sweep(
                loaded, min(budget, loaded.predictor.max_input_tokens), grids, stays
            )
            for budget in budgets
        }
        print(sweep)
        write_results(args.out, " ".join(sys.argv), {"stays": len(stays), "kept_vs_sliding": sweep})
        return
    results: dict[str, Any] = {
        "stays": len(rows),
        "hours": args.hours,
        "grid_hours": args.grid_hours,
        "budgets": {},
    }
    engine_chains: dict[str, dict[str, list[list[PreparedRecord]]]] = {}
    for budget in budgets:
        layout = PromptLayout(args.prompt_layout) if args.prompt_layout else None
        by_policy = predictors(
            loaded, min(budget, loaded.predictor.max_input_tokens), args.grid_hours, layout
        )
        figures: dict[str, Any] = {}
        for policy, predictor in by_policy.items():
            chains = [
                prepare_stay(
                    predictor,
                    dataset.events(row.subject_id),
                    rescore_times(row.prediction_time, args.hours),
                )
                for row in tqdm(rows, desc=f"prompts {budget} {policy}", file=sys.stdout)
            ]
            figures[policy] = prompt_figures(chains)
            if engine_stays.get(budget):
                engine_chains.setdefault(str(budget), {})[policy] = chains[: engine_stays[budget]]
        kept = figures["stable"]["events_kept_total"] / figures["sliding"]["events_kept_total"]
        figures["stable_events_kept_vs_sliding"] = round(kept, 4)
        results["budgets"][str(budget)] = figures
        print(budget, figures)
    command = " ".join(sys.argv)
    write_results(args.out, command, results)
    if engine_chains:
        results["engine_stays"] = engine_stays
        results["engine"] = {}
        asyncio.run(
            engine_phase(
                loaded,
                engine_chains,
                results["engine"],
                lambda: write_results(args.out, command, results),
            )
        )
        for budget, figures in results["engine"].items():
            print(budget, {k: v for k, v in figures.items() if k != "rows"})


if __name__ == "__main__":
    main()
