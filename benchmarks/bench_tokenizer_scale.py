"""Mining a large corpus in bounded memory: static n-gram counting streamed over ~50M tokens.

    .venv/bin/python benchmarks/bench_tokenizer_scale.py [--tokens 50000000] [--max-n 2]

The corpus is the rendered MIMIC-IV demo records (all patients' whole histories and ICU prompts)
streamed repeatedly until --tokens base tokens have passed; every pass shifts the numbers in the
text so the n-gram table keeps growing instead of only re-counting. Reports time and peak RSS.
"""

from __future__ import annotations

import argparse
import re
import resource
import time
from collections.abc import Iterator

from bench_tokenizer_data import icu_split, smollm2_tokenizer

from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.build import build_tokenizer


def stream(texts: list[str], passes: int) -> Iterator[str]:
    """`texts` `passes` times, digits rotated per pass (varied numbers, same structure)."""
    for k in range(passes):
        table = str.maketrans("0123456789", "".join(str((d + k) % 10) for d in range(10)))
        for text in texts:
            yield text.translate(table) if k else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--max-n", type=int, default=2)
    parser.add_argument("--budget", type=int, default=5000)
    args = parser.parse_args()
    base = BaseTokenizer.load(smollm2_tokenizer())
    train, test = icu_split(base, held_out_every=10**9)  # every patient
    texts = [t for t in train + test if not re.fullmatch(r"\s*", t)]
    per_pass = sum(map(len, base.encode_batch(texts)))
    passes = -(-args.tokens // per_pass)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    tok = build_tokenizer(base, stream(texts, passes), args.budget, args.max_n, "static")
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats = tok.corpus_stats
    print(
        f"mined {stats['n_tokens']:,} tokens ({passes} passes of {per_pass:,}), "
        f"max_n={args.max_n}, budget={args.budget}: {seconds:.0f} s, "
        f"{stats['n_tokens'] / seconds:,.0f} tokens/s, peak RSS {rss:,.0f} MiB "
        f"(before mining {rss_before:,.0f} MiB)"
    )


if __name__ == "__main__":
    main()
