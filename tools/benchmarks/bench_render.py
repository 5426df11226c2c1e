"""Rendering on real MEDS data: tokens per record, budgeted prompts, and speed.

    .venv/bin/python -m tools.benchmarks.bench_render \
        --meds ../shared/data/mimic-iv-demo-meds --base .cache/models/smollm2-135m-instruct \
        [--base ../shared/tokenizers/qwen2.5/tokenizer.json ...] \
        [--medtpe artefacts/smollm2-135m-icu]

Prints a markdown table per tokenizer. The "one line per event" row renders the same events
naively (full timestamp on every line, no grouping, no duplicate counts) for comparison. With
`--medtpe` (an artefact of the first `--base`), the same whole records and budgeted prompts are
also encoded with that MedTPE tokenizer: its compression rate of the rendered text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from medtpe.core.meds import MedsDataset, SubjectEvents, read_labels
from medtpe.core.metrics import compression_rate
from medtpe.core.paths import default_model_dir
from medtpe.core.prompt import ChatTemplate, Prompt, build_prompt
from medtpe.core.prompt.render import RenderedRecord, describe_code, event_line, render_record
from medtpe.core.tokenizer import BaseTokenizer, MedTPETokenizer
from tools.benchmarks.results_file import write_results


def naive_text(events: SubjectEvents, descriptions: dict[str, str]) -> str:
    """Baseline format: `YYYY-MM-DD HH:MM <event>` on every line."""
    lines = []
    for time_, code, value, text in zip(
        events.times, events.codes, events.numeric_values, events.text_values, strict=True
    ):
        stamp = (
            "static" if np.isnat(time_) else str(time_.astype("datetime64[m]")).replace("T", " ")
        )
        lines.append(f"{stamp} {event_line(*describe_code(code, descriptions), value, text)}")
    return "\n".join(lines)


def stats(values: list[int]) -> str:
    return (
        f"{statistics.mean(values):,.0f} | {statistics.median(values):,.0f} | "
        f"{min(values):,} | {max(values):,}"
    )


def summary(values: list[float]) -> dict[str, float]:
    """Mean, median, min and max."""
    return {
        "mean": round(statistics.mean(values), 3),
        "median": round(statistics.median(values), 3),
        "min": min(values),
        "max": max(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--labels", type=Path, help="default: <meds>/labels/icu_mortality.parquet")
    parser.add_argument("--base", type=Path, action="append", required=True)
    parser.add_argument("--task", default="icu_mortality")
    parser.add_argument("--max-input-tokens", type=int, default=8192)
    parser.add_argument("--medtpe", type=Path, help="a MedTPE artefact of the first --base")
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    results: dict[str, object] = {}

    start = time.perf_counter()
    dataset = MedsDataset.load(args.meds)
    print(
        f"load: {dataset.n_events:,} events, {len(dataset.subject_ids)} subjects "
        f"in {time.perf_counter() - start:.2f} s"
    )
    rows = read_labels(args.labels or args.meds / "labels" / "icu_mortality.parquet")
    template = ChatTemplate.from_model_dir(default_model_dir())
    for base in args.base:
        tokenizer = BaseTokenizer.load(base)
        full, naive, events = [], [], []
        start = time.perf_counter()
        records = [
            render_record(dataset.events(r.subject_id), dataset.descriptions, r.prediction_time)
            for r in rows
        ]
        render_s = time.perf_counter() - start
        for row, record in zip(rows, records, strict=True):
            full.append(len(tokenizer.encode(record.text)))
            before = dataset.events(row.subject_id).before(row.prediction_time)
            naive.append(len(tokenizer.encode(naive_text(before, dataset.descriptions))))
            events.append(record.n_events_total)
        start = time.perf_counter()
        prompts = [
            build_prompt(
                args.task,
                dataset.events(r.subject_id),
                r.prediction_time,
                tokenizer,
                template,
                args.max_input_tokens,
                dataset.descriptions,
            )
            for r in rows
        ]
        prompt_s = time.perf_counter() - start
        print(f"\n### {base} ({len(rows)} records, {args.task} prediction times)\n")
        print("| | mean | median | min | max |\n| --- | --- | --- | --- | --- |")
        print(f"| events before prediction time | {stats(events)} |")
        print(f"| tokens, this format (whole record) | {stats(full)} |")
        print(f"| tokens, one line per event (baseline) | {stats(naive)} |")
        prompt_tokens = stats([p.n_tokens_original for p in prompts])
        print(f"| tokens, prompt within {args.max_input_tokens:,} | {prompt_tokens} |")
        kept = [p.n_events_kept / p.n_events_total for p in prompts]
        print(
            f"| share of events kept in the prompt | {statistics.mean(kept):.2f} | "
            f"{statistics.median(kept):.2f} | {min(kept):.2f} | {max(kept):.2f} |"
        )
        print(
            f"\nthis format vs baseline: {1 - sum(full) / sum(naive):.1%} fewer tokens; "
            f"{sum(p.n_events_kept < p.n_events_total for p in prompts)}/{len(prompts)} truncated; "
            f"largest prompt: {max(p.n_tokens_original for p in prompts):,} tokens"
        )
        print(
            f"render (no budget): {render_s / len(rows) * 1000:.0f} ms/record; "
            f"build_prompt with budget: {prompt_s / len(rows) * 1000:.0f} ms/record"
        )
        results[str(base)] = {
            "records": len(rows),
            "events_before_prediction_time": summary(events),
            "tokens_whole_record": summary(full),
            "tokens_one_line_per_event": summary(naive),
            "prompt_tokens": summary([p.n_tokens_original for p in prompts]),
            "share_of_events_kept": summary(kept),
            "fewer_tokens_than_baseline": round(1 - sum(full) / sum(naive), 4),
            "truncated": sum(p.n_events_kept < p.n_events_total for p in prompts),
            "render_ms_per_record": round(render_s / len(rows) * 1000, 1),
            "build_prompt_ms_per_record": round(prompt_s / len(rows) * 1000, 1),
        }
        if args.medtpe is not None and base == args.base[0]:
            results[str(base)]["medtpe"] = medtpe_rates(args.medtpe, base, records, prompts)
    write_results(args.out, " ".join(sys.argv), results)


def medtpe_rates(
    artefact: Path, base: Path, records: list[RenderedRecord], prompts: list[Prompt]
) -> dict[str, object]:
    """Original and MedTPE token totals, and the compression rate, of the whole records and of
    the budgeted prompts' record text."""
    medtpe = MedTPETokenizer.load(artefact, base=base)
    out: dict[str, object] = {"artefact": str(artefact)}
    for name, texts in (
        ("whole_record", [r.text for r in records]),
        ("prompt", [p.record_text for p in prompts]),
    ):
        original = sum(map(len, medtpe.base.encode_batch(texts)))
        new = sum(map(len, medtpe.encode_batch(texts)))
        out[name] = {
            "original_tokens": original,
            "medtpe_tokens": new,
            "compression_rate": round(compression_rate(original, new), 5),
        }
        print(f"MedTPE {name}: {original:,} -> {new:,} tokens, CR {out[name]['compression_rate']}")
    return out


if __name__ == "__main__":
    main()
