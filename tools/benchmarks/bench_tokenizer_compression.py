"""Compression at equal budget on held-out ICU records, static vs bpe selection, and the cost on
text the vocabulary was not mined for.

    .venv/bin/python -m tools.benchmarks.bench_tokenizer_compression [--budget 5000] [--max-n 2 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from medtpe.core.metrics import compression_rate
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.build import METHODS, build_tokenizer
from tools.benchmarks.bench_tokenizer_data import QWEN, icu_split, smollm2_tokenizer, unmined_texts
from tools.benchmarks.results_file import write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=5000)
    parser.add_argument("--max-n", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--bases", nargs="+", default=["smollm2", "qwen2.5"])
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    paths = {"smollm2": smollm2_tokenizer(), "qwen2.5": QWEN}
    rows = []
    for name in args.bases:
        base = BaseTokenizer.load(paths[name])
        train, test = icu_split(base)
        n_train = sum(map(len, base.encode_batch(train)))
        n_test = sum(map(len, base.encode_batch(test)))
        print(
            f"{name}: mining {len(train)} texts / {n_train:,} tokens, "
            f"held out {len(test)} records / {n_test:,} tokens",
            flush=True,
        )
        for max_n in args.max_n:
            for method in METHODS:
                started = time.perf_counter()
                tok = build_tokenizer(base, train, args.budget, max_n, method, progress=False)
                seconds = time.perf_counter() - started
                n_new = sum(map(len, tok.encode_batch(test)))
                row = {
                    "base": name,
                    "method": method,
                    "max_n": max_n,
                    "budget": args.budget,
                    "new_tokens": len(tok.new_tokens),
                    "build_s": round(seconds, 1),
                    "held_out_cr": round(compression_rate(n_test, n_new), 4),
                    "mined_cr": round(tok.corpus_stats["sample_compression_rate"], 4),
                }
                for label, text in unmined_texts().items():
                    row[f"extra_tokens {label}"] = round(
                        len(tok.encode(text)) / len(base.encode(text)) - 1, 4
                    )
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_results(args.out, " ".join(sys.argv), rows)


if __name__ == "__main__":
    main()
