"""Encoding throughput of MedTPE vs the base `tokenizers` tokenizer on held-out ICU records,
single and batched, and how time grows with input length (1x, 10x, 100x).

    .venv/bin/python -m tools.benchmarks.bench_tokenizer_speed [--artefact DIR]

Without --artefact a MedTPE tokenizer is built first (SmolLM2, M = 5000, N = 2, default method).
Base and MedTPE runs alternate and the best of --repeats is kept, so background load on the
machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from medtpe.core.tokenizer import BaseTokenizer, MedTPETokenizer
from medtpe.core.tokenizer.build import build_tokenizer
from tools.benchmarks.bench_tokenizer_data import icu_split, smollm2_tokenizer
from tools.benchmarks.results_file import write_results


def best(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` wall-clock runs, in seconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--artefact", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    base = BaseTokenizer.load(smollm2_tokenizer())
    train, test = icu_split(base)
    if args.artefact:
        tok = MedTPETokenizer.load(args.artefact, base=base)
    else:
        tok = build_tokenizer(base, train, 5000, 2, progress=False)
    raw = base.tokenizer  # the stock `tokenizers.Tokenizer`
    n_tokens = sum(len(raw.encode(t, add_special_tokens=False).ids) for t in test)
    cases = {
        "single": (
            lambda: [raw.encode(t, add_special_tokens=False).ids for t in test],
            lambda: [tok.encode(t) for t in test],
        ),
        "batched": (
            lambda: [e.ids for e in raw.encode_batch(test, add_special_tokens=False)],
            lambda: tok.encode_batch(test),
        ),
    }
    result: dict[str, object] = {"cpus": os.cpu_count(), "records": len(test), "tokens": n_tokens}
    for name, (base_fn, medtpe_fn) in cases.items():
        t_base = t_medtpe = float("inf")
        for _ in range(args.repeats):  # alternate, keep the best of each
            t_base = min(t_base, best(base_fn, 1))
            t_medtpe = min(t_medtpe, best(medtpe_fn, 1))
        result[name] = {
            "base_tok_per_s": round(n_tokens / t_base),
            "medtpe_tok_per_s": round(n_tokens / t_medtpe),
            "ratio": round(t_base / t_medtpe, 3),
        }
    record = max(test, key=len)
    scaling = {}
    for factor in (1, 10, 100):
        text = record * factor
        n = len(raw.encode(text, add_special_tokens=False).ids)
        repeats = max(1, args.repeats // factor) + 1
        t_base = best(lambda text=text: raw.encode(text, add_special_tokens=False), repeats)
        t_medtpe = best(lambda text=text: tok.encode(text), repeats)
        scaling[f"{factor}x"] = {
            "tokens": n,
            "base_us_per_token": round(t_base / n * 1e6, 3),
            "medtpe_us_per_token": round(t_medtpe / n * 1e6, 3),
        }
    result["length_scaling"] = scaling
    print(json.dumps(result, indent=1))
    write_results(args.out, " ".join(sys.argv), result)


if __name__ == "__main__":
    main()
