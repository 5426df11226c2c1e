"""The authors' selection (github JasonZuu/MedTPE, `tpe/vocab_modify_tpe.py`) on the same text.

    git clone https://github.com/JasonZuu/MedTPE /tmp/medtpe_ref   # not part of this project
    .venv/bin/python benchmarks/bench_tokenizer_reference.py --reference-repo /tmp/medtpe_ref

Runs their `tpe_vocabulary_modify_fn` unmodified (imported from the checkout; their code is not
copied here) and their `TrieMerger` on the held-out records' base tokens, at M = 5000, N = 2,
with their default `filter_numbers=True` and with False. Their pipeline also deletes the base
merges producing evicted tokens; that only changes text containing those tokens, which this
count leaves out (their evicted tokens have frequency ~0 in ICU text).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from bench_tokenizer_data import QWEN, icu_split, smollm2_tokenizer
from results_file import write_results

from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.metrics import compression_rate


class _Rows(list):
    """The part of a `datasets.Dataset` their code uses: batched `.map` and iteration."""

    def map(self, fn: Callable, fn_kwargs: dict, batch_size: int = 1000, **_: object) -> _Rows:
        out = _Rows()
        for k in range(0, len(self), batch_size):
            batch = fn({"input": [r["input"] for r in self[k : k + batch_size]]}, **fn_kwargs)
            out.extend({"token": t} for t in batch["token"])
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference-repo", required=True, type=Path)
    parser.add_argument("--budget", type=int, default=5000)
    parser.add_argument("--max-n", type=int, default=2)
    parser.add_argument("--bases", nargs="+", default=["smollm2", "qwen2.5"])
    parser.add_argument("--filter-numbers", nargs="+", default=["true", "false"])
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    sys.modules["datasets"] = types.SimpleNamespace(DatasetDict=dict, load_dataset=None)
    sys.path.insert(0, str(args.reference_repo))
    from tpe.tpe_tokenizer_fast import TrieMerger
    from tpe.vocab_modify_tpe import tpe_vocabulary_modify_fn
    from transformers import PreTrainedTokenizerFast

    paths = {"smollm2": smollm2_tokenizer(), "qwen2.5": QWEN}
    rows: list[dict] = []
    for name in args.bases:
        base = BaseTokenizer.load(paths[name])
        train, test = icu_split(base)
        hf = PreTrainedTokenizerFast(tokenizer_file=str(paths[name]))
        byte_merges = [
            tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            for m in base.json_obj["model"]["merges"]
        ]
        test_tokens = [hf.tokenize(t) for t in test]
        n_test = sum(map(len, test_tokens))
        for flag in args.filter_numbers:
            started = time.perf_counter()
            _, _, tok_merges, info = tpe_vocabulary_modify_fn(
                hf,
                {"train": _Rows({"input": t} for t in train)},
                max_m=args.budget,
                max_n=args.max_n,
                filter_numbers=flag == "true",
                byte_merges=byte_merges,
                vocab_size=len(hf),
            )
            seconds = time.perf_counter() - started
            merger = TrieMerger(tok_merges)
            n_new = sum(len(merger.tokenize(toks)) for toks in test_tokens)
            row = {
                "base": name,
                "reference": True,
                "filter_numbers": flag,
                "max_n": args.max_n,
                "budget": args.budget,
                "new_tokens": len(info),
                "build_s": round(seconds, 1),
                "held_out_cr": round(compression_rate(n_test, n_new), 4),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_results(args.out, " ".join(sys.argv), rows)


if __name__ == "__main__":
    main()
