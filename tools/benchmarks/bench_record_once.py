"""The record read once: four tasks about one record against one task, on the real vLLM engine.

In the `record-first` prompt layout (`medtpe.core.prompt.layout`) every task asked of one record
shares the ids up to the end of the record; `Predictor.prepare_all` renders and tokenizes the
record once, `Predictor.answer_all` prefills the part the prompts share once and then answers
every task together, so vLLM's prefix cache computes the record once. Measured side by side in
one run, on `--records` held-out ICU windows whose prompt fills at least 90 % of `--budget`, taken
across patients (each held-out subject's first such window, then each one's second, ... of the
default artefact's build's ICU windows, 6-120 h after admission, of the subjects its split holds
out), the default model in `medtpe` mode, float32, prefix caching on, one engine:

- one task (`icu_mortality`) alone, cold (a fresh cache salt per call), against the four tasks
  (`TASKS`) in one `prepare_all` + `answer_all` call (one fresh salt per record): wall latency per
  record (prepare + answer) p50/p95, their ratio, each task's prompt tokens the engine read from
  its cache (`Answer.cached_tokens`). Each task's answer is compared with its own single-task
  answer (cold) at the same record reserve (`shell_tokens` of the four-task prompt, so both read
  the same record text): answers equal, max |Δp| over the answer options. The one-task call is
  that reserve's `icu_mortality` prompt (the same record the four-task call reads). Each task's
  own call is timed too (`alone_s`): the four-task call over the slowest of them (the least a
  call that answers every task can take) and over their sum (the four asked one after another);
- the same four tasks in the `task-first` layout (each prompt its own prefill, the four sent
  together): wall latency, the ratio new / old, the answers of both layouts compared;
- CPU off the engine per call, one task against four: `render_s + tokenize_s` of the prepared
  records and the process's CPU time around `prepare_all` (the least of `--cpu-repeats` calls);
- with `--stock`: stock vLLM's OpenAI server of the base model (float32, prefix caching on),
  running beside the engine and asked each record's four texts in each layout (old: the four
  together; new: the first alone, then the rest together) right before or after that record's
  MedTPE calls (alternately, so drift on the machine falls on both sides alike); answers compared
  with the MedTPE four-task call's; the four-task call over stock's old-layout four per record
  (median, least, most) besides the ratio of the medians, and the slowest task alone over it
  (the least that ratio can be: a call that answers every task waits for its slowest).

    nice -n 10 .venv/bin/python -m tools.benchmarks.bench_record_once --records 13 --stock \
        --out tools/benchmarks/results/record_once.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from medtpe.core.meds import MedsDataset, SubjectEvents
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.paths import default_model_dir
from medtpe.core.prompt.layout import PromptLayout
from medtpe.core.tasks import Task, get_task
from medtpe.core.tasks.answers import answer_end_ids
from medtpe.core.tasks.option_probabilities import option_probabilities
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import Engine
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Answer, Mode, Predictor, PreparedRecord
from medtpe.inference.sampling import Sampling
from medtpe.training.build_config import build_config
from medtpe.training.build_data import prediction_times
from medtpe.training.export import prepare_model_files
from tools.benchmarks.bench_vllm_plugin import start_server
from tools.benchmarks.results_file import write_results

TASKS = ("icu_mortality", "phenotyping", "readmission_30d", "pancreatic_cancer_1y")
"""The four tasks asked of each record; the first is the one-task call's."""
FILL = 0.9
"""A record counts when its first task's prompt fills at least this share of the budget."""
DEFAULT_BUILD = Path("artefacts/smollm2-135m-icu/build.yaml")


@dataclass(frozen=True)
class Window:
    """A held-out record at one prediction time."""

    subject_id: int
    prediction_time: datetime
    events: SubjectEvents


def held_out_windows(build_file: Path) -> tuple[Path, list[tuple[int, datetime]]]:
    """The build's MEDS root and its (subject, time) windows of the subjects its split holds
    out, in the build's order."""
    config = build_config(build_file, {"base": str(default_model_dir())})
    times = prediction_times(config)
    subjects = [s for s, _ in times]
    split = subject_split(config.meds, subjects, config.held_out, config.seed)
    held = set(split.train_and_held_out(subjects)[1])
    return Path(config.meds), [(s, t) for s, t in times if s in held]


def across_subjects(points: Sequence[tuple[int, datetime]]) -> list[tuple[int, datetime]]:
    """`points` taken across subjects: each subject's first window (subjects in their first
    window's order), then each one's second, and so on.

    >>> across_subjects([(1, "a"), (1, "b"), (2, "c")])
    [(1, 'a'), (2, 'c'), (1, 'b')]
    """
    by_subject: dict[int, list[tuple[int, datetime]]] = {}
    for point in points:
        by_subject.setdefault(point[0], []).append(point)
    rounds = max((len(windows) for windows in by_subject.values()), default=0)
    return [ws[i] for i in range(rounds) for ws in by_subject.values() if i < len(ws)]


def select_windows(
    predictor: Predictor,
    tasks: Sequence[Task],
    meds: Path,
    points: Sequence[tuple[int, datetime]],
    n: int,
) -> list[Window]:
    """`n` of the windows whose first task's four-task prompt fills `FILL` of the budget, taken
    `across_subjects` (fewer when fewer fill it)."""
    dataset = MedsDataset.load(meds)
    events = {subject: dataset.events(subject) for subject, _ in points}
    full = []
    for subject, when in tqdm(points, desc="select records", unit="window", file=sys.stdout):
        prompt = predictor.prepare_all(tasks, events[subject], when)[0].prompt
        if prompt.n_tokens_original >= FILL * predictor.max_input_tokens:
            full.append((subject, when))
    return [Window(s, t, events[s]) for s, t in across_subjects(full)[:n]]


def answer_row(prepared: PreparedRecord, answer: Answer, mode: Mode) -> dict[str, Any]:
    """One task's answer as the results file keeps it."""
    return {
        "task": prepared.task.name,
        "prediction": answer.prediction,
        "probabilities": answer.probabilities,
        "format_ok": answer.format_ok,
        "prompt_tokens": len(prepared.ids(mode)),
        "cached_tokens": answer.cached_tokens,
        "generate_s": round(answer.generate_s, 3),
    }


def max_abs_dp(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    """The largest |p_a - p_b| over the answer options both give (None when either has none)."""
    if not a or not b:
        return None
    common = a.keys() & b.keys()
    return max((abs(a[k] - b[k]) for k in common), default=None)


def compare(reference: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Answer rows against reference rows, pair by pair: how many give the same prediction, and
    the largest |Δp| over the pairs with probabilities."""
    pairs = list(zip(reference, other, strict=True))
    gaps = [
        gap
        for a, b in pairs
        if (gap := max_abs_dp(a["probabilities"], b["probabilities"])) is not None
    ]
    return {
        "compared": len(pairs),
        "equal_answers": sum(a["prediction"] == b["prediction"] for a, b in pairs),
        "max_abs_dp": round(max(gaps), 6) if gaps else None,
    }


def latency(seconds: Sequence[float]) -> dict[str, float]:
    """p50 and p95 (linear interpolation) of per-record seconds."""
    p50, p95 = np.percentile(seconds, [50, 95])
    return {"p50_s": round(float(p50), 3), "p95_s": round(float(p95), 3)}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, least and most of per-record ratios."""
    return {
        "p50": round(float(np.median(values)), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def ratio(numerator: dict[str, float], denominator: dict[str, float]) -> float:
    """The ratio of two `latency` figures' medians."""
    return round(numerator["p50_s"] / denominator["p50_s"], 3)


def prepare_cpu(
    predictor: Predictor, tasks: Sequence[Task], window: Window, repeats: int
) -> dict[str, float]:
    """The least of `repeats` `prepare_all` calls: its records' `render_s + tokenize_s` and the
    process's CPU seconds around it."""
    steps, cpu = [], []
    for _ in range(repeats):
        started = time.process_time()
        prepared = predictor.prepare_all(tasks, window.events, window.prediction_time)
        cpu.append(time.process_time() - started)
        steps.append(prepared[0].render_s + prepared[0].tokenize_s)
    return {"render_tokenize_s": round(min(steps), 4), "process_cpu_s": round(min(cpu), 4)}


async def timed_call(
    engine: Engine,
    predictor: Predictor,
    tasks: Sequence[Task],
    window: Window,
    sampling: Sampling,
    together: bool,
) -> tuple[float, list[PreparedRecord], list[Answer]]:
    """`prepare_all` then the answers under one fresh salt: `answer_all` (`together` False) or
    all at once (`together`); the wall seconds of both."""
    salt = uuid.uuid4().hex
    started = time.perf_counter()
    prepared = predictor.prepare_all(tasks, window.events, window.prediction_time)
    if together:
        answers = list(
            await asyncio.gather(
                *(predictor.answer(engine, p, sampling, cache_salt=salt) for p in prepared)
            )
        )
    else:
        answers = await predictor.answer_all(engine, prepared, sampling, cache_salt=salt)
    return time.perf_counter() - started, prepared, answers


async def measure_record(
    engine: Engine, predictor: Predictor, tasks: Sequence[Task], window: Window, args: Namespace
) -> dict[str, Any]:
    """One record's calls (one task, four tasks, four tasks in the old layout, each task alone at
    the four-task reserve) and CPU figures."""
    sampling = Sampling(max_new_tokens=args.max_new_tokens)
    mode = predictor.mode
    four_s, four_prepared, four = await timed_call(
        engine, predictor, tasks, window, sampling, together=False
    )
    shell = four_prepared[0].prompt.shell_tokens
    single = predictor.with_layout(PromptLayout.RECORD_FIRST, shell)
    calls = [
        await timed_call(engine, single, [task], window, sampling, together=False) for task in tasks
    ]
    one_s = calls[0][0]  # the first task (mortality) alone: the one-task call
    references = [answer_row(prepared[0], answers[0], mode) for _, prepared, answers in calls]
    old = predictor.with_layout(PromptLayout.TASK_FIRST)
    old_s, old_prepared, old_answers = await timed_call(
        engine, old, tasks, window, sampling, together=True
    )
    return {
        "subject_id": window.subject_id,
        "prediction_time": window.prediction_time.isoformat(),
        "n_tokens_original": four_prepared[0].prompt.n_tokens_original,
        "shell_tokens": shell,
        "shared_tokens": four_prepared[0].segmentation.n_shared(mode),
        "one_s": round(one_s, 3),
        "alone_s": [round(seconds, 3) for seconds, _, _ in calls],
        "four_s": round(four_s, 3),
        "old_four_s": round(old_s, 3),
        "single": references,
        "four": [answer_row(p, a, mode) for p, a in zip(four_prepared, four, strict=True)],
        "old_four": [
            answer_row(p, a, mode) for p, a in zip(old_prepared, old_answers, strict=True)
        ],
        "cpu_one": prepare_cpu(single, tasks[:1], window, args.cpu_repeats),
        "cpu_four": prepare_cpu(predictor, tasks, window, args.cpu_repeats),
    }


@dataclass(frozen=True)
class Stock:
    """Stock vLLM's OpenAI server of the base model, and what each request to it carries."""

    client: httpx.AsyncClient
    url: str
    stop_ids: list[int]
    max_new_tokens: int


def start_stock(loaded: LoadedModel, args: Namespace) -> tuple[Any, str]:
    """Stock vLLM's OpenAI server of the base model (float32, prefix caching on, the engine's
    context, batch and KV cache): its process and completions URL."""
    server = Namespace(
        max_model_len=loaded.engine_config.max_model_len,
        max_num_seqs=loaded.engine_config.options.max_num_seqs,
        # vLLM's CPU KV cache space is whole GiB
        kv_cache_gib=math.ceil(loaded.engine_config.options.kv_cache_gib or 4),
    )
    flags = ["--dtype", "float32", "--enable-prefix-caching"]
    process, port = start_server(default_model_dir(), server, args.logs / "stock.log", flags)
    return process, f"http://127.0.0.1:{port}/v1/completions"


def layout_texts(
    predictor: Predictor, tasks: Sequence[Task], window: Window
) -> dict[str, list[str]]:
    """The four tasks' prompt texts of one record in each layout (`old`: task-first; `new`:
    the predictor's record-first), as stock vLLM is sent them."""
    old = predictor.with_layout(PromptLayout.TASK_FIRST)
    return {
        layout: [
            p.prompt.text for p in which.prepare_all(tasks, window.events, window.prediction_time)
        ]
        for layout, which in (("old", old), ("new", predictor))
    }


async def stock_answers(
    stock: Stock, tasks: Sequence[Task], texts: list[str], together: bool
) -> tuple[float, list[dict[str, Any]]]:
    """The four texts to the stock server under one fresh salt, all at once (`together`) or the
    first alone then the rest together: wall seconds and answer rows."""
    salt = uuid.uuid4().hex

    async def one(task: Task, text: str) -> dict[str, Any]:
        body = {
            "model": "model",
            "prompt": text,
            "max_tokens": stock.max_new_tokens,
            "temperature": 0,
            "stop_token_ids": stock.stop_ids,
            "include_stop_str_in_output": True,
            "cache_salt": salt,
        }
        if task.answer_options:
            body["logprobs"] = 20
        response = await stock.client.post(stock.url, json=body, timeout=600)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        parsed = task.parse_answer(task.response_prefix + choice["text"])
        top = (choice.get("logprobs") or {}).get("top_logprobs") or []
        probabilities = (
            option_probabilities(list(top[0].items()), task.answer_options) if top else None
        )
        return {"task": task.name, "prediction": parsed.prediction, "probabilities": probabilities}

    started = time.perf_counter()
    pairs = list(zip(tasks, texts, strict=True))
    if together:
        rows = list(await asyncio.gather(*(one(t, x) for t, x in pairs)))
    else:
        rows = [await one(*pairs[0])]
        rows += await asyncio.gather(*(one(t, x) for t, x in pairs[1:]))
    return time.perf_counter() - started, rows


async def measure_stock(
    stock: Stock, tasks: Sequence[Task], texts: dict[str, list[str]]
) -> dict[str, Any]:
    """One record's four texts to stock vLLM: the old layout together, the new one the first
    alone then the rest together; wall seconds and answer rows of each."""
    old_s, old = await stock_answers(stock, tasks, texts["old"], together=True)
    new_s, new = await stock_answers(stock, tasks, texts["new"], together=False)
    return {"old_four_s": round(old_s, 3), "new_four_s": round(new_s, 3), "old": old, "new": new}


async def run_records(
    loaded: LoadedModel,
    tasks: Sequence[Task],
    windows: Sequence[Window],
    stock_url: str | None,
    args: Namespace,
    save: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Every record's calls on one engine (warmed up on the first record's first prompt, under
    no salt, so no measured call reads its blocks) and, with `stock_url`, on the stock server
    beside it (warmed up on the first record's old-layout texts), the two sides in turn first;
    `save(records)` after each record."""
    predictor = loaded.predictor
    engine = await asyncio.to_thread(start_vllm, loaded.engine_config)
    base = predictor.tokenizer.base
    stop_ids = sorted(answer_end_ids(base.tokens, base.vocab_size))
    try:
        first = predictor.prepare(tasks[0], windows[0].events, windows[0].prediction_time)
        await engine.warm_up(first.ids(predictor.mode))
        async with httpx.AsyncClient() as client:
            stock = None
            if stock_url is not None:
                stock = Stock(client, stock_url, stop_ids, args.max_new_tokens)
                warm = layout_texts(predictor, tasks, windows[0])["old"]
                await stock_answers(stock, tasks, warm, together=True)
            records: list[dict[str, Any]] = []
            for i, window in enumerate(
                tqdm(windows, desc="records", unit="record", file=sys.stdout)
            ):
                record = await measure_both(
                    engine, predictor, tasks, window, stock, i % 2 == 1, args
                )
                seconds = {k: record[k] for k in ("one_s", "four_s", "old_four_s")}
                if "stock" in record:
                    seconds["stock_old_four_s"] = record["stock"]["old_four_s"]
                print(window.subject_id, seconds, compare(record["single"], record["four"]))
                records.append(record)
                save(records)
            return records
    finally:
        engine.shutdown()


async def measure_both(
    engine: Engine,
    predictor: Predictor,
    tasks: Sequence[Task],
    window: Window,
    stock: Stock | None,
    stock_first: bool,
    args: Namespace,
) -> dict[str, Any]:
    """`measure_record`, and with `stock` its texts to stock vLLM (`record["stock"]`), stock's
    calls before the record's (`stock_first`) or after them."""
    if stock is None:
        return await measure_record(engine, predictor, tasks, window, args)
    texts = layout_texts(predictor, tasks, window)
    stock_part = await measure_stock(stock, tasks, texts) if stock_first else None
    record = await measure_record(engine, predictor, tasks, window, args)
    if stock_part is None:
        stock_part = await measure_stock(stock, tasks, texts)
    record["stock"] = {"first": stock_first, **stock_part}
    return record


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over every record: latencies and their ratios, each with its answers
    compared; cached tokens per task; CPU per call; stock vLLM's when the records have it."""
    one = latency([r["one_s"] for r in records])
    four = latency([r["four_s"] for r in records])
    old = latency([r["old_four_s"] for r in records])
    four_rows = [a for r in records for a in r["four"]]
    per_task: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(TASKS):
        rows = [r["four"][i] for r in records]
        per_task[name] = {
            "vs_single": compare([r["single"][i] for r in records], rows),
            "prompt_tokens_mean": round(float(np.mean([a["prompt_tokens"] for a in rows])), 1),
            "cached_tokens": [a["cached_tokens"] for a in rows],
        }
    cpu = {}
    for key in ("render_tokenize_s", "process_cpu_s"):
        one_cpu = float(np.median([r["cpu_one"][key] for r in records]))
        four_cpu = float(np.median([r["cpu_four"][key] for r in records]))
        cpu[key] = {
            "one_p50": round(one_cpu, 4),
            "four_p50": round(four_cpu, 4),
            "four_over_one": round(four_cpu / one_cpu, 3),
        }
    out: dict[str, Any] = {
        "records": len(records),
        "one_task": one,
        "four_tasks": four,
        "four_over_one": ratio(four, one),
        "each_alone_p50_s": {
            name: round(float(np.median([r["alone_s"][i] for r in records])), 3)
            for i, name in enumerate(TASKS)
        },
        "four_over_slowest_alone_p50": round(
            float(np.median([r["four_s"] / max(r["alone_s"]) for r in records])), 3
        ),
        "four_over_sum_alone_p50": round(
            float(np.median([r["four_s"] / sum(r["alone_s"]) for r in records])), 3
        ),
        "four_vs_single_answers": compare([a for r in records for a in r["single"]], four_rows),
        "per_task": per_task,
        "old_layout_four": old,
        "new_four_over_old_four": ratio(four, old),
        "old_vs_new_answers": compare([a for r in records for a in r["old_four"]], four_rows),
        "cpu_per_call": cpu,
    }
    stock = [r["stock"] for r in records if "stock" in r]
    if stock:
        stock_old = latency([s["old_four_s"] for s in stock])
        out["stock"] = {
            "old_layout_four": stock_old,
            "new_layout_four": latency([s["new_four_s"] for s in stock]),
            "ours_four_over_stock_old_four": ratio(four, stock_old),
            "ours_four_over_stock_old_four_per_record": spread(
                [r["four_s"] / r["stock"]["old_four_s"] for r in records]
            ),
            "slowest_alone_over_stock_old_four_per_record": spread(
                [max(r["alone_s"]) / r["stock"]["old_four_s"] for r in records]
            ),
            "stock_old_vs_ours": compare([a for s in stock for a in s["old"]], four_rows),
            "stock_new_vs_ours": compare([a for s in stock for a in s["new"]], four_rows),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=DEFAULT_BUILD, help="the artefact's build")
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=Sampling().max_new_tokens)
    parser.add_argument("--cpu-repeats", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="also stock vLLM's OpenAI server")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/bench_record_once"))
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    if args.records < 1:
        parser.error("--records must be at least 1")

    meds, points = held_out_windows(args.build)
    config = ModelConfig.from_options(
        max_input_tokens=args.budget,
        max_new_tokens=args.max_new_tokens,
        prompt_layout=PromptLayout.RECORD_FIRST,
        dtype="float32",
        enable_prefix_caching=True,
    )
    prepare_model_files(config)
    loaded = load_model(config)
    tasks = [get_task(name) for name in TASKS]
    windows = select_windows(loaded.predictor, tasks, meds, points, args.records)
    if len(windows) < args.records:
        raise SystemExit(
            f"only {len(windows)} held-out windows fill {FILL:.0%} of {args.budget} tokens"
        )
    stock_process, stock_url = start_stock(loaded, args) if args.stock else (None, None)
    command = "python -m tools.benchmarks.bench_record_once " + " ".join(sys.argv[1:])
    results: dict[str, Any] = {}

    def save(records: list[dict[str, Any]]) -> None:
        results.update(
            budget=loaded.predictor.max_input_tokens,
            tasks=list(TASKS),
            mode=loaded.identity.mode,
            artefact_id=loaded.identity.artefact_id,
            summary=summarize(records),
            records=records,
        )
        write_results(args.out, command, results)

    try:
        asyncio.run(run_records(loaded, tasks, windows, stock_url, args, save))
    finally:
        if stock_process is not None:
            stock_process.terminate()
            stock_process.wait(120)
    for key, value in results["summary"].items():
        print(key, value)


if __name__ == "__main__":
    main()
