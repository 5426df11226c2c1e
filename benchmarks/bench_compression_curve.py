"""Compression rate vs TPE budget M and maximum token length N (the paper's Figure 3).

Tokenizer only (no model): for each base tokenizer, MedTPE tokenizers are built with
`medtpe_core.build.build_tokenizer` on the ICU records of the training patients and measured on
the records of held-out patients (every 5th subject id in ascending order; the same rendered
text for every build). Each record is rendered as the model sees it: the newest events before
its prediction time within `--record-tokens` tokens of that base tokenizer.

    .venv/bin/python benchmarks/bench_compression_curve.py \\
        --tokenizer smollm2=.cache/models/smollm2-135m-instruct \\
        --tokenizer qwen2.5=../shared/tokenizers/qwen2.5/tokenizer.json \\
        --budgets 100,250,500,1000,2500,5000,10000 --max-n 2,3,4 --methods static,bpe \\
        --out benchmarks/results/compression_curve.json --plot docs/img/compression_curve.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.build import DEFAULT_METHOD, METHODS, build_tokenizer
from medtpe_core.meds_readers import MedsDataset, read_labels
from medtpe_core.metrics import compression_rate
from medtpe_core.render import render_record

SHARED_MEDS = Path("../shared/data/mimic-iv-demo-meds")
HELD_OUT_EVERY = 5


def rendered_records(
    meds_dir: Path, labels_path: Path, base: BaseTokenizer, max_tokens: int
) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): each label row's record within `max_tokens`, split by
    patient (every `HELD_OUT_EVERY`-th subject id in ascending order is held out)."""
    dataset = MedsDataset.load(meds_dir)
    held_out = set(sorted(dataset.subject_ids)[::HELD_OUT_EVERY])
    train, test = [], []
    for row in read_labels(labels_path):
        record = render_record(
            dataset.events(row.subject_id),
            dataset.descriptions,
            row.prediction_time,
            base,
            max_tokens,
        )
        (test if row.subject_id in held_out else train).append(record.text)
    return train, test


def curve(
    base: BaseTokenizer,
    train: list[str],
    test: list[str],
    budgets: list[int],
    max_ns: list[int],
    methods: list[str],
) -> list[dict[str, float]]:
    """One point per (selection method, N, M): held-out compression rate and build time;
    combinations `build_tokenizer` rejects are skipped (and printed)."""
    n_original = sum(map(len, base.encode_batch(test)))
    points = []
    for method, max_n, budget in itertools.product(methods, max_ns, budgets):
        started = time.perf_counter()
        try:
            tokenizer = build_tokenizer(base, train, budget, max_n, method, progress=False)
        except ValueError as exc:  # e.g. static N = 4 on a 151k vocabulary: n-gram keys overflow
            print(
                json.dumps(
                    {
                        "base": str(base.path),
                        "method": method,
                        "max_n": max_n,
                        "budget": budget,
                        "skipped": str(exc),
                    }
                ),
                flush=True,
            )
            continue
        seconds = time.perf_counter() - started
        n_medtpe = sum(map(len, tokenizer.encode_batch(test)))
        points.append(
            {
                "method": method,
                "max_n": max_n,
                "budget": budget,
                "n_new_tokens": len(tokenizer.new_tokens),
                "compression_rate": compression_rate(n_original, n_medtpe),
                "held_out_tokens_original": n_original,
                "held_out_tokens_medtpe": n_medtpe,
                "build_s": round(seconds, 1),
            }
        )
        print(json.dumps({"base": str(base.path), **points[-1]}), flush=True)
    return points


def plot(results: dict[str, list[dict[str, float]]], path: Path) -> None:
    """CR vs M, one panel per base tokenizer, one line per (method, N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), sharey=True)
    for ax, (name, points) in zip(
        list(getattr(axes, "flat", [axes])), results.items(), strict=True
    ):
        methods = sorted({p["method"] for p in points}, reverse=True)
        for method, max_n in itertools.product(methods, sorted({p["max_n"] for p in points})):
            line = [p for p in points if p["max_n"] == max_n and p["method"] == method]
            ax.plot(
                [p["budget"] for p in line],
                [100 * p["compression_rate"] for p in line],
                marker="o",
                linestyle="-" if method == methods[0] else "--",
                color=f"C{max_n - 2}",
                label=f"{method}, N = {max_n}",
            )
        ax.set_xscale("log")
        ax.set_title(f"{name} tokenizer")
        ax.set_xlabel("TPE budget M (new tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    axes_list = list(getattr(axes, "flat", [axes]))
    axes_list[0].set_ylabel("compression rate on held-out records (%)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    """Parse arguments, run the grid, write the JSON results and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, default=SHARED_MEDS)
    parser.add_argument("--labels", type=Path, default=None)
    parser.add_argument("--tokenizer", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--budgets", default="500,1000,2500,5000,10000")
    parser.add_argument("--max-n", default="2,3,4")
    parser.add_argument("--methods", default=",".join(METHODS), help="selection methods")
    parser.add_argument("--record-tokens", type=int, default=8192)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args()
    labels = args.labels or args.meds / "labels" / "icu_mortality.parquet"
    budgets = [int(b) for b in args.budgets.split(",")]
    max_ns = [int(n) for n in args.max_n.split(",")]
    results = {}
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        base = BaseTokenizer.load(path)
        train, test = rendered_records(args.meds, labels, base, args.record_tokens)
        results[name] = curve(base, train, test, budgets, max_ns, args.methods.split(","))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "default_method": DEFAULT_METHOD,
                "record_tokens": args.record_tokens,
                "held_out_every": HELD_OUT_EVERY,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    plot(results, args.plot)


if __name__ == "__main__":
    main()
