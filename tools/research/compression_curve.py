"""Compression rate against budget M, longest token N and selection method, chosen on the
training patients only; then the compression against the size of the mining corpus.

The split is the build's (`medtpe build-artefact --config`: its ICU windows, `held_out` and
`seed`); the records are the build's mining records (each training prediction time's newest
`mining_max_tokens` original tokens, `medtpe.core.tokenizer.corpus.ShardCorpus`), rendered once
and mined with `medtpe.core.tokenizer.build.build_tokenizer` (the selection
`build_tokenizer_from_meds` runs on the same records; `corpus` checks the two give the same
artefact).

    # M x N x method on an internal split of the training patients (every 5th one validates)
    .venv/bin/python -m tools.research.compression_curve grid \\
        --out tools/research/results/compression_curve_train.json
    # one setting mined on 25/50/100 % of the training patients, measured on the held-out ones
    .venv/bin/python -m tools.research.compression_curve corpus --method bpe --max-n 4 \\
        --budget 5000 --out tools/research/results/compression_curve_corpus_size.json

The compression rate is 1 - MedTPE tokens / base tokens over the records, merged throughout
(`rate`) and with the build's `plain_tail` left unmerged at each record's end (`rate_tail`).
Encode speed: `MedTPETokenizer.encode` against its base's `encode` on the same records, one text
per call, runs alternating, best of `--repeats` each; `speed_ratio` = base time / MedTPE time
(the same text per second, 1.0: as fast as the base).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from medtpe.core.meds.readers import data_shards, read_prediction_times
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.metrics import compression_rate
from medtpe.core.tokenizer import BaseTokenizer, MedTPETokenizer
from medtpe.core.tokenizer.build import (
    METHODS,
    build_tokenizer,
    build_tokenizer_from_meds,
    default_protected_texts,
)
from medtpe.core.tokenizer.corpus import CorpusSpec, ShardCorpus
from medtpe.core.tokenizer.encoding import merge_depth
from medtpe.training.build_config import BuildConfig, BuildConfigError, build_config
from medtpe.training.build_data import prediction_times, write_label_file
from tools.benchmarks.results_file import write_results

DEFAULT_CONFIG = Path("artefacts/smollm2-135m-icu/build.yaml")
DEFAULT_BASE = Path(".cache/models/smollm2-135m-instruct")
Record = tuple[int, str]
"""A rendered record: (subject id, text)."""


class Corpus:
    """The build's split and the records of its prediction times, rendered once."""

    def __init__(self, config: BuildConfig, labels: Path):
        self.config = config
        self.labels = labels
        times = prediction_times(config)
        subjects = [s for s, _ in times]
        split = subject_split(config.meds, subjects, config.held_out, config.seed)
        self.split_source = split.source
        self.train, self.held_out = split.train_and_held_out(subjects)
        write_label_file(labels, times)
        self.base = BaseTokenizer.load(config.base)
        self.protected = default_protected_texts(config.base)

    def spec(self, subjects: Sequence[int]) -> CorpusSpec:
        """The build's mining corpus (`build_artefact.mine`) restricted to `subjects`."""
        return CorpusSpec(
            self.config.meds,
            self.config.mining_max_tokens,
            subjects=frozenset(subjects),
            labels=self.labels,
        )

    def records(self, subjects: Sequence[int]) -> list[Record]:
        """The records of `subjects`' prediction times, in the mining corpus's order."""
        spec = self.spec(subjects)
        out: list[Record] = []
        for shard in data_shards(self.config.meds):
            corpus = ShardCorpus(spec, shard)
            times = read_prediction_times(self.labels, corpus.subject_ids)  # texts' order
            texts = corpus.texts(self.base)
            out += [(subject, text) for (subject, _), text in zip(times, texts, strict=True)]
        return out


def of(records: Sequence[Record], subjects: Sequence[int]) -> list[str]:
    """The texts of `records` whose subject is in `subjects`, order kept."""
    wanted = set(subjects)
    return [text for subject, text in records if subject in wanted]


def mine(corpus: Corpus, texts: Sequence[str], method: str, max_n: int, budget: int) -> tuple:
    """(tokenizer, build seconds) mined from `texts` as the build mines (min. frequency 2)."""
    started = time.perf_counter()
    tok = build_tokenizer(
        corpus.base, texts, budget, max_n, method, corpus.protected, progress=False
    )
    return tok, time.perf_counter() - started


def rates(tok: MedTPETokenizer, texts: Sequence[str], plain_tail: int) -> dict[str, Any]:
    """Base and MedTPE token counts of `texts` and the compression rates, merged throughout and
    with `plain_tail` ids left unmerged at each text's end."""
    n_base = sum(map(len, tok.base.encode_batch(texts)))
    n_merged = sum(map(len, tok.encode_batch(texts, plain_tail=0)))
    n_tail = sum(map(len, tok.encode_batch(texts, plain_tail=plain_tail)))
    return {
        "records": len(texts),
        "base_tokens": n_base,
        "medtpe_tokens": n_merged,
        "rate": round(compression_rate(n_base, n_merged), 4),
        "rate_tail": round(compression_rate(n_base, n_tail), 4),
    }


def encode_speed(tok: MedTPETokenizer, texts: Sequence[str], repeats: int) -> dict[str, Any]:
    """Best-of-`repeats` seconds of encoding `texts` with the base and with MedTPE (alternating),
    one text per call (`encode`) and all in one call (`encode_batch`): base tokens per second and
    base time / MedTPE time."""
    n_base = sum(len(tok.base.encode(t)) for t in texts)
    modes = {
        "": (lambda: [tok.base.encode(t) for t in texts], lambda: [tok.encode(t) for t in texts]),
        "batch_": (lambda: tok.base.encode_batch(texts), lambda: tok.encode_batch(texts)),
    }
    result: dict[str, Any] = {}
    for prefix, (base_fn, medtpe_fn) in modes.items():
        t_base = t_medtpe = math.inf
        for _ in range(repeats):
            t_base = min(t_base, _seconds(base_fn))
            t_medtpe = min(t_medtpe, _seconds(medtpe_fn))
        result |= {
            f"{prefix}base_tok_per_s": round(n_base / t_base),
            f"{prefix}medtpe_base_tok_per_s": round(n_base / t_medtpe),
            f"{prefix}speed_ratio": round(t_base / t_medtpe, 3),
        }
    return result


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def round_trip(tok: MedTPETokenizer, texts: Sequence[str]) -> dict[str, int]:
    """Records whose decode(encode) differs, and records MedTPE encodes longer than the base."""
    lossy = sum(tok.decode(tok.encode(t)) != t for t in texts)
    longer = sum(len(tok.encode(t)) > len(tok.base.encode(t)) for t in texts)
    return {"records": len(texts), "not_lossless": lossy, "longer_than_base": longer}


def recommend(cells: list[dict[str, Any]], tolerance: float, min_speed: float) -> dict | None:
    """The rule: keep the cells whose `speed_ratio` is at least `min_speed`, or, when the
    reference (static, N = 2: the selection of the current default) itself measures below it,
    at least 0.95 x the reference's median; among them the (method, N) whose best rate over M is
    highest, or the smallest N within `tolerance` of it; then that setting's smallest M within
    `tolerance` of its best rate."""
    reference = sorted(
        c["speed_ratio"] for c in cells if (c["method"], c["max_n"]) == ("static", 2)
    )
    floor = min_speed
    if reference and reference[len(reference) // 2] < min_speed:
        floor = round(0.95 * reference[len(reference) // 2], 3)
    fast = [c for c in cells if c["speed_ratio"] >= floor]
    if not fast:
        return None
    plateau: dict[tuple[str, int], float] = {}
    for c in fast:
        key = (c["method"], c["max_n"])
        plateau[key] = max(plateau.get(key, 0.0), c["rate"])
    best = max(plateau.values())
    near = [k for k, v in plateau.items() if v >= best - tolerance]
    method, max_n = min(near, key=lambda k: (k[1], -plateau[k]))
    rows = [c for c in fast if (c["method"], c["max_n"]) == (method, max_n)]
    chosen = min(
        (c for c in rows if c["rate"] >= plateau[(method, max_n)] - tolerance),
        key=lambda c: c["budget"],
    )
    return {
        "rule": (
            f"cells with speed_ratio >= {min_speed} (or >= 0.95 x the static N=2 reference's "
            f"median when it is below {min_speed}); (method, N): the highest best-over-M rate, "
            f"or the smallest N within {tolerance * 100:g} point of it; M: the smallest within "
            f"{tolerance * 100:g} point of that setting's best rate"
        ),
        "speed_floor": floor,
        "best_rate_any_setting": best,
        "plateau_of_choice": plateau[(method, max_n)],
        **{k: chosen[k] for k in ("method", "max_n", "budget", "rate", "speed_ratio")},
    }


def internal_split(train: Sequence[int], every: int) -> tuple[list[int], list[int]]:
    """(mining subjects, validation subjects): every `every`-th training subject (ascending
    ids, the first included) validates."""
    validation = list(train[::every])
    return [s for s in train if s not in set(validation)], validation


def cpu_speed(args: argparse.Namespace, corpus: Corpus) -> dict[str, Any]:
    """Encode speed of chosen settings (mined as in `grid`) in this process's CPU seconds, which
    other processes' load does not inflate: rounds alternate the base and every setting, one
    text per `encode` call, best of `--repeats` each."""
    mine_subjects, val_subjects = internal_split(corpus.train, args.every)
    records = corpus.records(corpus.train)
    mine_texts, val_texts = of(records, mine_subjects), of(records, val_subjects)
    toks = {}
    for setting in tqdm(args.setting, desc="mining", unit="setting"):
        method, max_n, budget = setting.split(":")
        toks[setting] = mine(corpus, mine_texts, method, int(max_n), int(budget))[0]
    base = corpus.base
    n_base = sum(len(base.encode(t)) for t in val_texts)
    best = dict.fromkeys(["base", *toks], math.inf)
    for _ in tqdm(range(args.repeats), desc="rounds", unit="round"):
        best["base"] = min(best["base"], _cpu_seconds(lambda: [base.encode(t) for t in val_texts]))
        for name, tok in toks.items():
            seconds = _cpu_seconds(lambda tok=tok: [tok.encode(t) for t in val_texts])
            best[name] = min(best[name], seconds)
    return {
        "validation_records": len(val_texts),
        "base_tokens": n_base,
        "repeats": args.repeats,
        "base_cpu_s": round(best["base"], 3),
        "settings": [
            {
                "setting": name,
                "merge_depth": merge_depth(tok.merges),
                "cpu_s": round(best[name], 3),
                "medtpe_base_tok_per_cpu_s": round(n_base / best[name]),
                "cpu_speed_ratio": round(best["base"] / best[name], 3),
            }
            for name, tok in toks.items()
        ],
    }


def _cpu_seconds(fn: Callable[[], object]) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def grid(args: argparse.Namespace, corpus: Corpus) -> dict[str, Any]:
    """Every cell mined on the training patients but every `--every`-th, measured on those."""
    train = corpus.train
    mine_subjects, val_subjects = internal_split(train, args.every)
    records = corpus.records(train)
    mine_texts, val_texts = of(records, mine_subjects), of(records, val_subjects)
    speed_texts = val_texts[: args.speed_records]
    settings = [("static", 2)] + [("bpe", n) for n in args.bpe_n]
    result: dict[str, Any] = {
        "split_source": corpus.split_source,
        "train_subjects": len(train),
        "mining_subjects": len(mine_subjects),
        "validation_subjects": val_subjects,
        "mining_records": len(mine_texts),
        "mining_tokens": sum(map(len, corpus.base.encode_batch(mine_texts))),
        "validation_records": len(val_texts),
        "speed_records": len(speed_texts),
        "plain_tail": corpus.config.plain_tail,
        "max_build_s": args.max_build_s,
        "cells": [],
        "skipped": [],
    }
    too_slow: dict[str, tuple[int, int]] = {}  # method -> (N, M) of its first build over time
    bar = tqdm([(m, n, b) for m, n in settings for b in args.budgets], unit="cell")
    for method, max_n, budget in bar:
        bar.set_description(f"{method} N={max_n} M={budget}")
        slow_n, slow_m = too_slow.get(method, (math.inf, math.inf))
        if max_n >= slow_n and budget >= slow_m and (max_n, budget) != (slow_n, slow_m):
            result["skipped"].append({"method": method, "max_n": max_n, "budget": budget})
            continue
        tok, seconds = mine(corpus, mine_texts, method, max_n, budget)
        cell = {
            "method": method,
            "max_n": max_n,
            "budget": budget,
            "new_tokens": len(tok.new_tokens),
            "build_s": round(seconds, 1),
            **rates(tok, val_texts, corpus.config.plain_tail),
            **encode_speed(tok, speed_texts, args.repeats),
        }
        result["cells"].append(cell)
        tqdm.write(str(cell))
        if seconds > args.max_build_s and method not in too_slow:
            too_slow[method] = (max_n, budget)  # the larger cells of this method are skipped
        result["recommendation"] = recommend(result["cells"], args.tolerance, args.min_speed)
        write_results(args.out, " ".join(sys.argv), result)
    choice = result["recommendation"]
    if choice is not None and args.choice_file is not None:
        args.choice_file.write_text(
            f"{choice['method']} {choice['max_n']} {choice['budget']} "
            f"{choice['rate']} {choice['speed_ratio']}\n"
        )
        print(f"choice: {args.choice_file}")
    return result


def corpus_size(args: argparse.Namespace, corpus: Corpus) -> dict[str, Any]:
    """One setting mined on nested seeded fractions of the training patients, measured on the
    held-out ones; a log-linear fit of the rate on the mining tokens, extrapolated."""
    order = list(corpus.train)
    random.Random(corpus.config.seed).shuffle(order)
    records = corpus.records(corpus.train + corpus.held_out)
    held_texts = of(records, corpus.held_out)
    full = sorted(corpus.train)
    points, full_tok = [], None
    for fraction in tqdm(args.fractions, desc="corpus fractions", unit="fraction"):
        subjects = sorted(order[: max(1, round(len(order) * fraction))])
        texts = of(records, subjects)
        tok, seconds = mine(corpus, texts, args.method, args.max_n, args.budget)
        point = {
            "fraction": fraction,
            "subjects": len(subjects),
            "mining_records": len(texts),
            "mining_tokens": sum(map(len, corpus.base.encode_batch(texts))),
            "new_tokens": len(tok.new_tokens),
            "build_s": round(seconds, 1),
            **rates(tok, held_texts, corpus.config.plain_tail),
        }
        points.append(point)
        tqdm.write(str(point))
        if subjects == full:
            full_tok = tok
    if full_tok is None:
        full_tok, _ = mine(corpus, of(records, full), args.method, args.max_n, args.budget)
    started = time.perf_counter()
    via_build = build_tokenizer_from_meds(
        corpus.config.base,
        corpus.spec(full),
        args.budget,
        args.max_n,
        args.method,
        corpus.protected,
        progress=False,
    )
    build_path_s = time.perf_counter() - started
    fit = log_linear([p["mining_tokens"] for p in points], [p["rate"] for p in points])
    largest = max(p["mining_tokens"] for p in points)
    return {
        "split_source": corpus.split_source,
        "setting": {"method": args.method, "max_n": args.max_n, "budget": args.budget},
        "held_out_subjects": len(corpus.held_out),
        "held_out_records": len(held_texts),
        "plain_tail": corpus.config.plain_tail,
        "points": points,
        "fit": fit,
        "extrapolation_100x_records": {
            "mining_tokens": largest * 100,
            "rate": round(fit["intercept"] + fit["slope"] * math.log(largest * 100), 4),
            "note": "an extrapolation of the fit beyond the measured range, at the same M",
        },
        "same_artefact_as_build_path": via_build.artefact_id == full_tok.artefact_id,
        "build_path_s": round(build_path_s, 1),
        "held_out_round_trip": round_trip(full_tok, held_texts),
    }


def log_linear(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares of y = intercept + slope * ln(x)."""
    lx = [math.log(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in lx)
    slope = sum((x - mx) * (y - my) for x, y in zip(lx, ys, strict=True)) / sxx
    intercept = my - slope * mx
    return {
        "intercept": round(intercept, 5),
        "slope": round(slope, 5),
        "per_doubling": round(slope * math.log(2), 5),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (`--help`)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="build settings")
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE, help="the base model dir")
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    steps = parser.add_subparsers(dest="step", required=True)
    g = steps.add_parser("grid", help="M x N x method on the training patients only")
    g.add_argument("--budgets", type=int, nargs="+", default=[1000, 2500, 5000, 8000])
    g.add_argument("--bpe-n", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    g.add_argument("--every", type=int, default=5, help="every k-th training patient validates")
    g.add_argument("--repeats", type=int, default=3, help="encode-speed runs (best kept)")
    g.add_argument("--speed-records", type=int, default=24, help="records timed for speed")
    g.add_argument("--max-build-s", type=float, default=180.0, help="slower: skip larger cells")
    g.add_argument("--tolerance", type=float, default=0.005, help="rate within this of best")
    g.add_argument("--min-speed", type=float, default=0.9, help="least speed_ratio allowed")
    g.add_argument("--choice-file", type=Path, default=None, help="one line: the choice")
    v = steps.add_parser("speed", help="encode speed of chosen settings in CPU seconds")
    v.add_argument("--setting", nargs="+", required=True, help="METHOD:N:M, e.g. bpe:8:8000")
    v.add_argument("--every", type=int, default=5, help="every k-th training patient validates")
    v.add_argument("--repeats", type=int, default=7, help="rounds (best kept)")
    c = steps.add_parser("corpus", help="one setting on nested fractions of the training patients")
    c.add_argument("--method", choices=METHODS, required=True)
    c.add_argument("--max-n", type=int, required=True)
    c.add_argument("--budget", type=int, required=True)
    c.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    args = parser.parse_args(argv)
    for name in ("budgets", "bpe_n"):
        if any(v < (2 if name == "bpe_n" else 1) for v in getattr(args, name, [])):
            parser.error(f"--{name.replace('_', '-')}: values must be positive (N at least 2)")
    for setting in getattr(args, "setting", []):
        parts = setting.split(":")
        if len(parts) != 3 or parts[0] not in METHODS or not all(p.isdigit() for p in parts[1:]):
            parser.error(f"--setting {setting}: expected METHOD:N:M, METHOD one of {METHODS}")
    if args.step == "corpus" and not all(0 < f <= 1 for f in args.fractions):
        parser.error("--fractions: each in (0, 1]")
    if not args.base.exists():
        parser.error(f"--base {args.base}: no such model directory (medtpe prepare-model)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the step the command line names."""
    args = parse_args(argv)
    try:
        config = build_config(args.config, {"base": args.base})
    except (BuildConfigError, OSError) as exc:
        sys.exit(f"--config {args.config}: {exc}")
    labels = Path(".cache") / "compression_curve" / "labels.parquet"
    labels.parent.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(config, labels)
    steps = {"grid": grid, "speed": cpu_speed, "corpus": corpus_size}
    result = steps[args.step](args, corpus)
    write_results(args.out, " ".join(sys.argv), result)


if __name__ == "__main__":
    main()
