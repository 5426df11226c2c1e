"""Fidelity that can resolve 0.01: many held-out prediction points, artefacts paired on them.

Fidelity needs no labels, so every few hours of each held-out ICU stay is a point (the stays of
the patients an artefact's build held out, `held_out_subjects` in its `build_report.json`).
Three steps:

    python -m tools.research.bench_fidelity points --artefact artefacts/smollm2-135m-icu \\
        --every-hours 6 --n 120 --out .cache/fidelity/points_120.parquet
    medtpe evaluate ... --labels .cache/fidelity/points_120.parquet --split all \\
        --mode both|original|medtpe --dtype float32|auto --max-input-tokens 4096 --out RUN.json
    python -m tools.research.bench_fidelity pair --original RUN.json:original \\
        --artefact default=RUN.json:medtpe --artefact distilled=OTHER.json:medtpe ... --out R.json

`pair` also reads the windows a build's fidelity gate answered (`build_report.json@4096:medtpe`),
so two builds' gates pair on the same held-out windows.

`diagnose` (float32, a Hugging Face forward per prompt and side: what the drift is made of)
answers the same points at each budget with the original model and each set of rows, and reads
the answer position: |Δp|, the probability mass the reused ids receive there (their rows are
also the tied LM head), and the relative error of the hidden state of every layer at the last
prompt position:

    python -m tools.research.bench_fidelity diagnose --points .cache/fidelity/points_24.parquet \
        --budgets 1024,2048 --rows mean --rows default=artefacts/smollm2-135m-icu \
        --rows distilled=DIR:base --out tools/research/results/fidelity_points/diagnosis.json

`general` asks whether compression costs the model its language: on general English text
(Python's own reference documentation, `pydoc_data`, in chunks), the cross-entropy of the next
original token at every shared end, read through the original tokens and through MedTPE tokens
with each set of rows (the reused ids left out of both distributions):

    python -m tools.research.bench_fidelity general --rows mean --rows default=... --out R.json

`layers` reads held-out snippets (`medtpe.core.tokenizer.snippets`, cut from the held-out patients'
ICU prompts) with the original and each set of rows, and reports the relative error of the hidden
state of every layer at the aligned positions, split into merged positions (a MedTPE token) and
plain ones (a shared token after merged ones): where in the network the rows' error sits.

    python -m tools.research.bench_fidelity layers --rows mean --rows default=... --out R.json

`readings` pairs readings of several `diagnose` runs on the points they share (a set of rows
read in one run, another in an earlier run on more points):

    python -m tools.research.bench_fidelity readings --budget 4096 --reading new=A.json:default \
        --reading old=B.json:default --out R.json

`points` writes a MEDS label file (the stay's ICU death as its label: fidelity ignores it);
`medtpe evaluate` answers the points with the service's engine path (the served dtype, or
float32: the rows' own error); `pair` reads the runs back, pairs every artefact with the one
original run on the same points (same prompt text) and reports each artefact's |Δp| (mean, p95)
and every two artefacts' paired difference with patient-level bootstrap intervals
(`tools.research.fidelity_figures.paired_difference`); with `--floor A.json:original
B.json:original`, the engine's own floor (the original model in the served dtype against float32 on
the same points).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from medtpe.core.metrics.fidelity import PairedAnswer, fidelity
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.stored_report import mode_results
from tools.benchmarks.results_file import write_results
from tools.research.fidelity_figures import (
    logit_agreement,
    logit_shift,
    paired_difference,
    paired_r_difference,
    rounding_parts,
)

if TYPE_CHECKING:
    from medtpe.training.answer_scoring import RowsModel

STAYS = Path("metadata/icu_stays.parquet")
FIRST_HOURS = 6
"""The first point of a stay: hours after ICU admission."""
SEED = 1


def held_out_points(
    meds: Path, subjects: set[int], every_hours: float, n: int | None
) -> list[dict[str, Any]]:
    """(subject, time, ICU death) every `every_hours` from `FIRST_HOURS` after each ICU
    admission of `subjects` until discharge, in (subject, time) order; with `n`, `n` of them
    drawn stay by stay in turns (each stay's points in a seeded random order), so every stay
    is represented before any gets a second point."""
    stays = pq.read_table(meds / STAYS).to_pylist()
    rng = random.Random(SEED)
    by_stay = []
    for stay in sorted(stays, key=lambda s: (s["subject_id"], s["intime"])):
        if stay["subject_id"] not in subjects:
            continue
        hours, points = FIRST_HOURS, []
        while (time := stay["intime"] + timedelta(hours=hours)) < stay["outtime"]:
            points.append(
                {
                    "subject_id": stay["subject_id"],
                    "prediction_time": time,
                    "boolean_value": bool(stay["died_in_icu"]),
                }
            )
            hours += every_hours
        rng.shuffle(points)
        by_stay.append(points)
    turns = [p for points in itertools.zip_longest(*by_stay) for p in points if p is not None]
    chosen = turns[:n] if n is not None else turns
    return sorted(chosen, key=lambda p: (p["subject_id"], p["prediction_time"]))


def points(args: argparse.Namespace) -> None:
    """Write the held-out points' label file."""
    report = json.loads((args.artefact / "build_report.json").read_text())
    rows = held_out_points(args.meds, set(report["held_out_subjects"]), args.every_hours, args.n)
    table = pa.table(
        {
            "subject_id": pa.array([r["subject_id"] for r in rows], pa.int64()),
            "prediction_time": pa.array([r["prediction_time"] for r in rows], pa.timestamp("us")),
            "boolean_value": pa.array([r["boolean_value"] for r in rows], pa.bool_()),
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out)
    print(f"{len(rows)} points of {len({r['subject_id'] for r in rows})} patients: {args.out}")


def _rows(spec: str, tokenizer: MedTPETokenizer, model: RowsModel) -> tuple[str, Any, str]:
    """`NAME=ARTEFACT_DIR[:OUTPUT]`, or an initialisation by name (`mean`: the constituents'
    mean, tied; `last`: the last constituent's row, base head) → (name, rows, output)."""
    from medtpe.training.embedding_init import init_new_rows
    from medtpe.training.export import load_rows

    name, _, where = spec.partition("=")
    if not where:
        rows = init_new_rows(model.model, tokenizer.new_tokens, method=name)
        return name, rows, "tied" if rows.output is None else "base"
    path, _, output = where.partition(":")
    rows = load_rows(Path(path))[0]
    if output == "tied":  # the trained input rows on both sides, whatever output rows are stored
        rows = dataclasses.replace(rows, output=None, output_base=False)
    return name, rows, output or "tied"


def diagnose(args: argparse.Namespace) -> None:
    """Answers of the points at each budget (float32, or `--dtype`): original against each set
    of rows."""
    import torch

    from medtpe.core.meds import MedsDataset, read_labels
    from medtpe.core.prompt import ChatTemplate
    from medtpe.core.tasks import get_task
    from medtpe.inference.predictor import Predictor
    from medtpe.training.answer_scoring import RowsModel

    task = get_task("icu_mortality")
    tokenizer = MedTPETokenizer.load(args.artefact)
    template = ChatTemplate.from_model_dir(args.base)
    dataset = MedsDataset.load(args.meds)
    model = RowsModel(args.base, args.threads, args.device, getattr(torch, args.dtype))
    variants = [_rows(spec, tokenizer, model) for spec in args.rows]
    new_ids = [t.id for t in tokenizer.new_tokens]
    points = read_labels(args.points)
    budgets = [int(b) for b in args.budgets.split(",")]
    results: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "budgets": {}}
    earlier = json.loads(args.original_from.read_text())["results"] if args.original_from else None
    for budget in budgets:
        predictors = {
            mode: Predictor(tokenizer, template, mode, budget, dataset.descriptions)
            for mode in ("original", "medtpe")
        }
        read_before = (
            {r["key"]: r for r in earlier["budgets"][str(budget)]["records"]} if earlier else {}
        )
        rows = []
        for point in tqdm(points, desc=f"diagnose {budget}", unit="point"):
            events = dataset.events(point.subject_id)
            record = predictors["original"].prepare(task, events, point.prediction_time)
            seg = record.segmentation
            reference = None
            if point.key in read_before:  # the original's reading of the same prompt, earlier
                before = read_before[point.key]
                if before["n_original"] != len(seg.original_ids):
                    raise SystemExit(f"{point.key}: --original-from read another prompt")
                p_orig = before["p_original"]
            else:
                model.set_rows(new_ids, None)
                reference = model.score(seg.original_ids)
                p_orig = predictors["original"].option_probabilities(task, reference.top_logprobs)
            row: dict[str, Any] = {
                "key": point.key,
                "subject_id": point.subject_id,
                "n_original": len(seg.original_ids),
                "n_medtpe": len(seg.medtpe_ids),
                "p_original": p_orig,
                "variants": {},
            }
            positions: dict[str, list[int] | list[float] | None] = {"": None}
            if args.original_positions:  # is the drift made of the shorter prompt's positions?
                positions["@original-positions"] = tokenizer.original_positions(
                    seg.medtpe_ids, seg.original_ids
                ).tolist()
            for scale in args.position_scale:  # what one RoPE scale for every prompt recovers
                positions[f"@x{scale:g}"] = (np.arange(len(seg.medtpe_ids)) * scale).tolist()
            medtpe = seg.medtpe_ids
            readings = [(suffix, medtpe, at, None) for suffix, at in positions.items()] + [
                (f"@yarn{stretch:g}", medtpe, None, stretch) for stretch in args.rope_stretch
            ]
            readings += [  # the same text, its end unmerged: once per point, not per set of rows
                (f"@tail{k}", tokenizer.encode_ids(seg.original_ids, plain_tail=k), None, None)
                for k in args.plain_tail
            ]
            masks = {MERGED_KEYS: merged_keys_mask} if args.merged_keys else {}
            if args.merged_keys_weighted:
                masks[MERGED_KEYS + "-weighted"] = merged_keys_bias
            if masks:  # one key per merge, perfect rows: the original tokens, base rows
                kept = tokenizer.original_positions(seg.medtpe_ids, seg.original_ids)
                model.set_rows(new_ids, None)
            for mask_name, make_mask in masks.items():
                scored = model.score(
                    seg.original_ids, visible=make_mask(kept, len(seg.original_ids))
                )
                row["variants"][mask_name] = {
                    "p": predictors["original"].option_probabilities(task, scored.top_logprobs),
                    "new_id_mass": scored.new_id_mass,
                    "layer_error": [],
                    "top_is_new": False,
                    "hidden_keys": int(len(seg.original_ids) - len(np.unique(kept))),
                }
            for (name, variant_rows, output), (suffix, ids, at, stretch) in itertools.product(
                variants, readings
            ):
                model.set_rows(new_ids, variant_rows, output)
                if stretch is None and variant_rows is not None:  # read as its export serves it
                    stretch = variant_rows.rope_stretch
                model.set_rope_stretch(stretch)
                scored = model.score(ids, at)
                model.set_rope_stretch(None)
                p = predictors["medtpe"].option_probabilities(task, scored.top_logprobs)
                error = []
                if reference is not None:
                    error = ((scored.hidden - reference.hidden) ** 2).sum(-1) / (
                        reference.hidden**2
                    ).sum(-1)
                row["variants"][name + suffix] = {
                    "p": p,
                    "new_id_mass": scored.new_id_mass,
                    "layer_error": [round(float(e), 5) for e in error],
                    "top_is_new": max(scored.top_logprobs, key=scored.top_logprobs.get) in new_ids,
                    "n_ids": len(ids),
                }
            rows.append(row)
        results["budgets"][str(budget)] = {
            "records": rows,
            "summary": _diagnosis_summary(rows, list(rows[0]["variants"]), args.resamples),
        }
        for name, figures in results["budgets"][str(budget)]["summary"].items():
            print(
                budget, name, json.dumps({k: v for k, v in figures.items() if k != "layer_error"})
            )
        write_results(args.out, " ".join(sys.argv), results)  # each budget kept as it ends


MERGED_KEYS = "merged-keys"
"""`diagnose --merged-keys`'s reading: the original tokens, one key per merged token."""


def merged_keys_mask(kept: np.ndarray, n: int) -> np.ndarray:
    """(n, n) causal attention (query, key) over n original tokens in which each token that a
    MedTPE token merges into a later one (a position not in `kept`, the positions MedTPE tokens
    end at) is seen only up to the position its merge ends at: the keys a merged prompt lacks,
    every other reading exact (the merge's last token still reads the whole pair).

    >>> merged_keys_mask(np.array([1, 2]), 3).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    visible = np.tril(np.ones((n, n), dtype=bool))
    ends = np.unique(kept)
    hidden = np.setdiff1d(np.arange(n), ends)
    owners = ends[np.searchsorted(ends, hidden)]
    visible[:, hidden] &= np.arange(n)[:, None] <= owners[None, :]
    return visible


def merged_keys_bias(kept: np.ndarray, n: int) -> np.ndarray:
    """`merged_keys_mask` as an additive float mask in which each merge's last token, for the
    tokens after its merge, weighs as many keys as its merge has tokens (+log of that count):
    one key standing for the pair's attention mass, not for its content.

    >>> np.exp(merged_keys_bias(np.array([1, 2]), 3)).round(3).tolist()
    [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 2.0, 1.0]]
    """
    visible = merged_keys_mask(kept, n)
    ends = np.unique(kept)
    sizes = np.diff(np.concatenate([[-1], ends]))  # tokens per merge, ending at each end
    bias = np.where(visible, 0.0, -np.inf).astype(np.float32)
    after = np.arange(n)[:, None] > ends[None, :]
    bias[:, ends] += np.where(after, np.log(sizes)[None, :], 0.0).astype(np.float32)
    return bias


def _variant_pairs(records: list[dict[str, Any]], variant: str) -> list[PairedAnswer]:
    """The original against `variant` on each `diagnose` record."""
    return [
        PairedAnswer(r["subject_id"], None, None, r["p_original"], r["variants"][variant]["p"])
        for r in records
    ]


def _diagnosis_summary(
    rows: list[dict[str, Any]], names: list[str], resamples: int
) -> dict[str, Any]:
    """Per set of rows: fidelity of p(yes), its logit shift (`logit_shift`), mean new-id mass,
    mean layer-error profile; and every two sets' paired difference."""
    paired = {name: _variant_pairs(rows, name) for name in names}
    summary: dict[str, Any] = {}
    for name in names:
        figures = fidelity(paired[name], resamples)
        summary[name] = {
            "delta_p_mean": figures["delta_p_mean"],
            "delta_p_p95": figures["delta_p_p95"]["value"],
            "delta_p_n": figures["delta_p_n"],
            "signed_dp_mean": float(
                np.mean(
                    [
                        r["variants"][name]["p"]["yes"] - r["p_original"]["yes"]
                        for r in rows
                        if r["variants"][name]["p"] and r["p_original"]
                    ]
                )
            ),
            "shift": logit_shift(paired[name], "yes", resamples),
            "new_id_mass_mean": float(np.mean([r["variants"][name]["new_id_mass"] for r in rows])),
            "new_id_mass_max": float(np.max([r["variants"][name]["new_id_mass"] for r in rows])),
            "top_is_new": sum(r["variants"][name]["top_is_new"] for r in rows),
            "layer_error": _mean_profile([r["variants"][name]["layer_error"] for r in rows]),
        }
    return summary | _differences(paired, resamples)


def _differences(
    paired: dict[str, list[PairedAnswer]],
    resamples: int,
    difference: Callable[..., dict[str, Any]] = paired_difference,
) -> dict[str, dict[str, Any]]:
    """Every two sets' paired `difference` ("b - a", in the order given): of the mean |Δp|
    (`paired_difference`) or of the logits' r (`paired_r_difference`)."""
    names = list(paired)
    return {
        f"{b} - {a}": difference(paired[a], paired[b], resamples)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }


def _mean_profile(profiles: list[list[float]]) -> list[float]:
    """The mean layer-error profile of the points that have one (none: empty)."""
    measured = [profile for profile in profiles if profile]
    return np.mean(measured, axis=0).round(5).tolist() if measured else []


def _joined_records(paths: list[Path]) -> tuple[dict[str, dict[str, dict]], str]:
    """`diagnose` runs joined: {budget: {point key: record}} over every file (runs of the same
    rows on different points), and their dtype."""
    joined: dict[str, dict[str, dict]] = {}
    dtypes = set()
    for path in paths:
        run = json.loads(path.read_text())["results"]
        dtypes.add(run.get("dtype", "float32"))  # runs from before `--dtype` read float32
        for budget, readings in run["budgets"].items():
            joined.setdefault(budget, {}).update((r["key"], r) for r in readings["records"])
    if len(dtypes) != 1:
        raise ValueError(f"runs of different dtypes joined: {sorted(dtypes)}")
    return joined, dtypes.pop()


def served(args: argparse.Namespace) -> None:
    """The served dtype beside the engine's own floor, from `diagnose` runs of the same points
    (float32 and the served dtype; each side's files joined, budgets in any of them): the floor
    is the original model in the served dtype against itself in float32; each set of rows'
    served |Δp| is against the original in the served dtype, as the service compares them;
    what that error is made of (`rounding_parts`: the rows' own error and the two prompts'
    roundings); and how many points change answer (p("yes") across 0.5) in either run."""
    exact, _ = _joined_records(args.float32)
    rounded, dtype = _joined_records(args.served)
    results: dict[str, Any] = {"budgets": {}}
    for budget, by_key in rounded.items():
        keys = [k for k in by_key if k in exact.get(budget, {})]
        records = [by_key[k] for k in keys]
        exact_records = [exact[budget][k] for k in keys]
        floor_pairs = [
            PairedAnswer(e["subject_id"], None, None, e["p_original"], r["p_original"])
            for e, r in zip(exact_records, records, strict=True)
        ]
        floor = fidelity(floor_pairs, args.resamples)
        figures: dict[str, Any] = {
            "points": len(records),
            "floor": {
                "delta_p_mean": floor["delta_p_mean"],
                "delta_p_p95": floor["delta_p_p95"],
                "agreement": logit_agreement(floor_pairs, "yes", args.resamples),
            },
            "rows": {},
        }
        names = args.rows or [f"{v}={v}" for v in records[0]["variants"]]
        for name, exact_name in (spec.partition("=")[::2] for spec in names):
            pairs = _variant_pairs(records, name)
            exact_pairs = _variant_pairs(exact_records, exact_name or name)
            served_fidelity = fidelity(pairs, args.resamples)
            figures["rows"][name] = {
                "float32_name": exact_name or name,
                "delta_p_mean": served_fidelity["delta_p_mean"],
                "delta_p_p95": served_fidelity["delta_p_p95"]["value"],
                "to_floor": served_fidelity["delta_p_mean"]["value"]
                / floor["delta_p_mean"]["value"],
                "agreement": logit_agreement(pairs, "yes", args.resamples),
                "rounding_parts": rounding_parts(exact_pairs, pairs, "yes", args.resamples),
                "answers_differ": {
                    side: sum(_answer(p.probs_original) != _answer(p.probs_medtpe) for p in read)
                    for side, read in (("float32", exact_pairs), (dtype, pairs))
                },
            }
        results["budgets"][budget] = figures
        print(budget, json.dumps(figures, indent=1))
    write_results(args.out, " ".join(sys.argv), results)


def rope_check(args: argparse.Namespace) -> None:
    """vLLM's YaRN against `RowsModel.set_rope_stretch`: the base model, RoPE's slow dimensions
    stretched by `--rope-stretch` as a `rope_parameters` entry of config.json, float32, the
    original ids of the first `--n` points at `--budget`: the top log-probabilities of the next
    token from both (and from the plain RoPE reading: what a stretch vLLM ignored would give)."""
    import os

    import torch
    from vllm import LLM, SamplingParams

    from medtpe.core.meds import MedsDataset, read_labels
    from medtpe.core.prompt import ChatTemplate
    from medtpe.core.rope_stretch import stretched_rope
    from medtpe.core.tasks import get_task
    from medtpe.inference.engines.protocol import EngineOptions
    from medtpe.inference.engines.vllm_engine import bind_cpu_cores
    from medtpe.inference.predictor import Predictor
    from medtpe.training.answer_scoring import TOP_K, RowsModel

    task = get_task("icu_mortality")
    tokenizer = MedTPETokenizer.load(args.artefact)
    dataset = MedsDataset.load(args.meds)
    predictor = Predictor(
        tokenizer, ChatTemplate.from_model_dir(args.base), "original", args.budget,
        dataset.descriptions,
    )  # fmt: skip
    prompts = [
        predictor.prepare(
            task, dataset.events(p.subject_id), p.prediction_time
        ).segmentation.original_ids
        for p in read_labels(args.points)[: args.n]
    ]
    model = RowsModel(args.base, args.threads)
    plain = [model.score(ids).top_logprobs for ids in prompts]
    model.set_rope_stretch(args.rope_stretch)
    reference = [model.score(ids).top_logprobs for ids in prompts]
    stretched = Path(args.work)
    stretched.mkdir(parents=True, exist_ok=True)
    for item in args.base.iterdir():
        if item.name != "config.json" and not (stretched / item.name).exists():
            os.symlink(item.resolve(), stretched / item.name)
    config = json.loads((args.base / "config.json").read_text())
    config["rope_parameters"] = stretched_rope(
        config["rope_parameters"], config["max_position_embeddings"], args.rope_stretch
    )
    (stretched / "config.json").write_text(json.dumps(config, indent=1))
    del model
    torch.set_num_threads(1)
    bind_cpu_cores(EngineOptions())
    llm = LLM(
        str(stretched), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 30,
        max_model_len=max(len(ids) for ids in prompts) + 1,
    )  # fmt: skip
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP_K)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    rows = []
    for ids, ref, unstretched, out in zip(prompts, reference, plain, outputs, strict=True):
        served = {i: lp.logprob for i, lp in out.outputs[0].logprobs[0].items()}
        shared = sorted(set(ref) & set(served), key=lambda i: -ref[i])
        rows.append(
            {
                "tokens": len(ids),
                "top_same": max(ref, key=ref.get) == max(served, key=served.get),
                "shared_top": len(shared),
                "max_abs_logprob_diff": max(abs(ref[i] - served[i]) for i in shared),
                "max_abs_logprob_diff_to_plain_rope": max(
                    abs(unstretched[i] - served[i]) for i in set(unstretched) & set(served)
                ),
                "p_yes_hf": predictor.option_probabilities(task, ref),
                "p_yes_vllm": predictor.option_probabilities(task, served),
            }
        )
        print(json.dumps(rows[-1]))
    results = {"rope_stretch": args.rope_stretch, "prompts": rows}
    write_results(args.out, " ".join(sys.argv), results)


def _answer(p: dict[str, float] | None) -> bool | None:
    """The answer p("yes") gives (None: no probability)."""
    return None if not p else p["yes"] >= 0.5


def held_out_prompts(args: argparse.Namespace, tokenizer: MedTPETokenizer) -> list[list[int]]:
    """Base ids of the held-out patients' prompts at 24 h (mortality) and 72 h (phenotyping)
    after each ICU admission, at `args.budget` tokens."""
    from medtpe.core.meds import MedsDataset
    from medtpe.core.prompt import ChatTemplate, build_prompt
    from medtpe.core.tasks import get_task

    report = json.loads((args.artefact / "build_report.json").read_text())
    held = set(report["held_out_subjects"])
    dataset = MedsDataset.load(args.meds)
    template = ChatTemplate.from_model_dir(args.base)
    prompts = []
    for stay in pq.read_table(args.meds / STAYS).to_pylist():
        for hours, task in ((24, "icu_mortality"), (72, "phenotyping")):
            time = stay["intime"] + timedelta(hours=hours)
            if stay["subject_id"] in held and time < stay["outtime"]:
                prompt = build_prompt(
                    get_task(task),
                    dataset.events(stay["subject_id"]),
                    time,
                    tokenizer.base,
                    template,
                    args.budget,
                    dataset.descriptions,
                )
                prompts.append(prompt.base_ids)
    return prompts


def layers(args: argparse.Namespace) -> None:
    """Relative error of every layer's hidden state at aligned positions of held-out snippets,
    merged and plain positions apart, for each set of rows."""
    import torch

    from medtpe.core.tokenizer.snippets import cut, draw
    from medtpe.training.answer_scoring import RowsModel

    tokenizer = MedTPETokenizer.load(args.artefact)
    model = RowsModel(args.base, threads=args.threads)
    variants = [_rows(spec, tokenizer, model) for spec in args.rows]
    new_ids = [t.id for t in tokenizer.new_tokens]
    pool = [s for ids in held_out_prompts(args, tokenizer) for s in cut(tokenizer, ids, 64)]
    snippets = draw(tokenizer, pool, args.snippets, 0, SEED)
    merged = torch.tensor([s.student[i] in set(new_ids) for s in snippets for i, _ in s.pairs])

    def states(side: int) -> list[Any]:
        rows = [s.teacher if side else s.student for s in snippets]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
        with torch.inference_mode():
            out = model.model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        at = torch.tensor([k * width + p[side] for k, s in enumerate(snippets) for p in s.pairs])
        return [h.flatten(0, 1)[at] for h in out.hidden_states]

    model.set_rows(new_ids, None)
    teacher = states(1)
    results: dict[str, Any] = {
        "snippets": len(snippets),
        "positions": len(merged),
        "merged_share": float(merged.float().mean()),
        "rows": {},
    }
    for name, rows, output in variants:
        model.set_rows(new_ids, rows, output)
        student = states(0)
        results["rows"][name] = {
            part: [
                round(
                    float((s[sel] - t[sel]).pow(2).sum(-1).mean() / t[sel].pow(2).sum(-1).mean()), 4
                )
                for s, t in zip(student, teacher, strict=True)
            ]
            for part, sel in (
                ("all", torch.ones_like(merged)),
                ("merged", merged),
                ("plain", ~merged),
            )
        }
        for part, errors in results["rows"][name].items():
            print(name, part, " ".join(f"{e:.3f}" for e in errors))
    write_results(args.out, " ".join(sys.argv), results)


def general(args: argparse.Namespace) -> None:
    """Cross-entropy of the next original token at shared ends of general text, original
    against MedTPE reading with each set of rows."""
    import pydoc_data.topics

    import torch

    from medtpe.training.answer_scoring import RowsModel

    tokenizer = MedTPETokenizer.load(args.artefact)
    model = RowsModel(args.base, threads=args.threads)
    variants = [_rows(spec, tokenizer, model) for spec in args.rows]
    new_ids = [t.id for t in tokenizer.new_tokens]
    keep = torch.ones(tokenizer.base.vocab_size, dtype=torch.bool)
    keep[new_ids] = False
    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    base = tokenizer.base_encode(text)
    chunks = [base[k : k + args.chunk] for k in range(0, args.chunks * args.chunk, args.chunk)]
    totals: dict[str, list[float]] = {"original": [], **{v[0]: [] for v in variants}}
    merged = 0
    for chunk in tqdm(chunks, desc="general text", unit="chunk"):
        ids = tokenizer.encode_ids(chunk, plain_tail=0)  # every pair merged: the rows' cost
        s_ends, t_ends = tokenizer.shared_ends(ids, chunk)
        inside = t_ends < len(chunk) - 1
        s_at, t_at = torch.as_tensor(s_ends[inside]), torch.as_tensor(t_ends[inside])
        target = torch.tensor(chunk)[t_at + 1]
        scored = keep[target]
        merged += len(ids) - len(chunk)
        model.set_rows(new_ids, None)
        totals["original"].append(
            _next_ce(model.next_token_logprobs(chunk)[t_at], target, keep, scored)
        )
        for name, rows, output in variants:
            model.set_rows(new_ids, rows, output)
            model.set_rope_stretch(rows.rope_stretch)  # read as its export serves it
            logprobs = model.next_token_logprobs(ids)[s_at]
            model.set_rope_stretch(None)
            totals[name].append(_next_ce(logprobs, target, keep, scored))
    results = {
        "text": "pydoc_data.topics (Python reference documentation), sorted topics",
        "chunks": len(chunks),
        "chunk_tokens": args.chunk,
        "tokens_saved_share": -merged / (len(chunks) * args.chunk),
        "cross_entropy": {name: float(np.mean(v)) for name, v in totals.items()},
    }
    results["change"] = {
        name: results["cross_entropy"][name] - results["cross_entropy"]["original"]
        for name in totals
        if name != "original"
    }
    print(json.dumps(results, indent=1))
    write_results(args.out, " ".join(sys.argv), results)


def _next_ce(logprobs: Any, target: Any, keep: Any, scored: Any) -> float:
    """Mean cross-entropy (nats) of `target` under `logprobs` renormalised over the `keep` ids,
    over the positions whose target is kept (`scored`)."""
    import torch

    kept = torch.log_softmax(logprobs[:, keep], dim=-1)
    index = torch.cumsum(keep.long(), 0) - 1  # column of each kept id in `kept`
    picked = kept[torch.arange(len(target)), index[target]]
    return float(-picked[scored].mean())


def _pairs(original: list[RecordResult], other: list[RecordResult]) -> list[PairedAnswer]:
    """The records of two runs paired by key (same prompt text: checked by token counts)."""
    by_key = {r.key: r for r in other}
    pairs = []
    for first in original:
        second = by_key.get(first.key)
        if second is None:
            continue
        if second.original_tokens != first.original_tokens:
            raise ValueError(f"{first.key}: the runs rendered different prompts")
        pairs.append(
            PairedAnswer(
                int(first.key.split("@")[0]),
                first.prediction,
                second.prediction,
                first.probabilities,
                second.probabilities,
            )
        )
    return pairs


def _named(spec: str) -> tuple[str, str]:
    name, _, run = spec.partition("=")
    return name, run


def _run_results(spec: str) -> list[RecordResult]:
    """`REPORT.json:MODE` (an evaluation report) or `build_report.json@BUDGET:MODE` (the
    windows a build's fidelity gate answered at that budget) → that mode's per-record results."""
    path, _, mode = spec.rpartition(":")
    report, at, budget = path.partition("@")
    if not at:
        return mode_results(spec)
    records = json.loads(Path(report).read_text())["gate"][budget]["records"]
    return [RecordResult.from_json(record[mode]) for record in records]


def pair(args: argparse.Namespace) -> None:
    """Each artefact's fidelity against the original run (or its own, e.g. each served dtype's
    MedTPE against the original in that dtype), r of the yes-logits where both have a
    probability, and every two artefacts' paired difference of |Δp| (on the points both runs
    answered with probabilities)."""
    original = _run_results(args.original)
    paired = {
        name: _pairs(_run_results(own) if own else original, _run_results(run))
        for name, (run, _, own) in ((n, r.partition(",")) for n, r in map(_named, args.artefact))
    }
    results: dict[str, Any] = {
        "original": args.original,
        "artefacts": dict(map(_named, args.artefact)),
        "fidelity": {name: fidelity(p, args.resamples) for name, p in paired.items()},
        "shift": {name: logit_shift(p, args.option, args.resamples) for name, p in paired.items()},
        "agreement": {
            name: logit_agreement(p, args.option, args.resamples) for name, p in paired.items()
        },
    }
    results["differences"] = _differences(paired, args.resamples)
    if args.floor:
        served, reference = (_run_results(spec) for spec in args.floor)
        results["floor"] = fidelity(_pairs(reference, served), args.resamples)
    for name, figures in results["fidelity"].items():
        dp = figures["delta_p_mean"]
        print(
            f"{name}: n={figures['delta_p_n']} mean |dp| {dp['value']:.4f} "
            f"[{dp['low']:.4f}, {dp['high']:.4f}] p95 {figures['delta_p_p95']['value']:.4f}"
        )
    for name, shape in results["shift"].items():
        if shape["n"]:
            shift = shape["shift_mean"]
            print(
                f"{name}: p({args.option}) {shape['signed_mean']:+.4f} signed, lower on "
                f"{shape['n_lower']}/{shape['n']}; logit shift {shift['value']:+.3f} "
                f"[{shift['low']:+.3f}, {shift['high']:+.3f}] sd {shape['shift_sd']:.3f}; "
                f"left after the mean shift {shape['residual_mean']:.4f}"
            )
    for name, diff in results["differences"].items():
        print(f"{name}: {diff['value']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}]")
    write_results(args.out, " ".join(sys.argv), results)


def rounding(args: argparse.Namespace) -> None:
    """`rounding_parts` of two runs each of the original and the artefact on the same records,
    float32 and the served dtype (`REPORT.json:MODE` or `build_report.json@BUDGET:MODE`, e.g.
    two builds' gates in either dtype): the served |Δp| split into the rows' own error and the
    two prompts' roundings."""
    exact = _pairs(*map(_run_results, args.float32))
    rounded = _pairs(*map(_run_results, args.served))
    results = rounding_parts(exact, rounded, args.option, args.resamples)
    print(json.dumps(results, indent=1))
    write_results(args.out, " ".join(sys.argv), results)


def readings(args: argparse.Namespace) -> None:
    """Readings of `diagnose` runs (`NAME=RUN.json:VARIANT`, at one budget; `RUN1.json,RUN2.json`
    joins runs of the same rows on different points) paired on the points they share: each
    one's |Δp| against its own run's original reading, every two readings' paired difference
    of |Δp| and of r (the same points, patient-level bootstrap)."""
    by_name = {}
    for name, where in map(_named, args.reading):
        paths, _, variant = where.rpartition(":")
        joined, _ = _joined_records([Path(path) for path in paths.split(",")])
        by_name[name] = (joined[str(args.budget)], variant)
    keys = [k for k in next(iter(by_name.values()))[0] if all(k in r for r, _ in by_name.values())]
    paired = {
        name: _variant_pairs([records[k] for k in keys], variant)
        for name, (records, variant) in by_name.items()
    }
    results: dict[str, Any] = {"budget": args.budget, "points": len(keys), "readings": {}}
    for name, answers in paired.items():
        figures = fidelity(answers, args.resamples)
        results["readings"][name] = {
            "delta_p_mean": figures["delta_p_mean"],
            "delta_p_p95": figures["delta_p_p95"]["value"],
            "shift": logit_shift(answers, "yes", args.resamples),
            "agreement": logit_agreement(answers, "yes", args.resamples),
        }
    results["differences"] = _differences(paired, args.resamples)
    results["r_differences"] = _differences(paired, args.resamples, paired_r_difference)
    print(json.dumps(results, indent=1))
    write_results(args.out, " ".join(sys.argv), results)


def _inputs(step: argparse.ArgumentParser, meds: bool = True, base: bool = True) -> None:
    """The data, base model and artefact options a step reads."""
    if meds:
        step.add_argument("--meds", type=Path, default=Path("../shared/data/mimic-iv-demo-meds"))
    if base:
        step.add_argument("--base", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    step.add_argument("--artefact", type=Path, default=Path("artefacts/smollm2-135m-icu"))


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("points", help="held-out prediction points as a MEDS label file")
    _inputs(p, base=False)
    p.add_argument("--every-hours", type=float, default=6.0)
    p.add_argument("--n", type=int, default=None, help="evenly spread subset of the points")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(run=points)
    d = steps.add_parser("diagnose", help="float32 answers, reused-id mass, layer errors")
    _inputs(d)
    d.add_argument("--points", type=Path, required=True)
    d.add_argument("--budgets", default="1024,2048,4096,8192")
    d.add_argument(
        "--rows",
        action="append",
        default=[],
        help="mean | NAME=ARTEFACT_DIR[:tied|base] (tied: the input rows serve the head)",
    )
    d.add_argument(
        "--merged-keys",
        action="store_true",
        help=f"also read the original tokens with each token that MedTPE merges into a later "
        f"one hidden from every token after its merge ('{MERGED_KEYS}'): the drift one key "
        "per merged token costs with perfect rows, all else exact",
    )
    d.add_argument(
        "--merged-keys-weighted",
        action="store_true",
        help="also that reading with each merge's last token weighing as many keys as its "
        "merge has tokens in the attention of later tokens: is the loss the mass or the content",
    )
    d.add_argument(
        "--original-from",
        type=Path,
        help="an earlier diagnose run (same data, model and budgets): the original's readings "
        "of the points it holds are taken from it, not recomputed (no layer errors there)",
    )
    d.add_argument(
        "--plain-tail",
        type=int,
        action="append",
        default=[],
        help="also read each set of rows with the prompt's last K original tokens left "
        "unmerged (the question and the record's end read as the original reads them)",
    )
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--device", default="cpu", help="torch device: cpu, cuda")
    d.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="float32: the rows' own error; bfloat16: with the served dtype's rounding",
    )
    d.add_argument(
        "--original-positions",
        action="store_true",
        help="also read each set of rows with every MedTPE token at its last constituent's "
        "original position (RoPE): what the prompt's fewer positions contribute",
    )
    d.add_argument(
        "--position-scale",
        type=float,
        action="append",
        default=[],
        help="also read each set of rows at positions 0, s, 2s, ... (RoPE, linear scaling: "
        "what one scale for every prompt, e.g. the mean compression, recovers)",
    )
    d.add_argument(
        "--rope-stretch",
        type=float,
        action="append",
        default=[],
        help="also read each set of rows with RoPE's slow dimensions stretched by s (YaRN, "
        "factor 1/s; the fast ones as trained): a config.json entry stock vLLM loads",
    )
    d.add_argument("--resamples", type=int, default=1000)
    d.add_argument("--out", type=Path)
    d.set_defaults(run=diagnose)
    v = steps.add_parser("served", help="the served dtype beside the engine's own floor")
    v.add_argument("--float32", type=Path, nargs="+", required=True, help="diagnose runs")
    v.add_argument(
        "--served", type=Path, nargs="+", required=True, help="diagnose runs, same points"
    )
    v.add_argument(
        "--rows",
        action="append",
        help="SERVED_NAME[=FLOAT32_NAME]: the rows to read and their name in the float32 runs "
        "(default: every served variant, the same name in float32)",
    )
    v.add_argument("--resamples", type=int, default=1000)
    v.add_argument("--out", type=Path)
    v.set_defaults(run=served)
    r = steps.add_parser("rope-check", help="vLLM's YaRN against the stretched HF reading")
    _inputs(r)
    r.add_argument("--points", type=Path, required=True)
    r.add_argument("--budget", type=int, default=4096)
    r.add_argument("--n", type=int, default=3)
    r.add_argument("--rope-stretch", type=float, default=1.88)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--work", type=Path, default=Path(".cache/fidelity/rope-check"))
    r.add_argument("--out", type=Path)
    r.set_defaults(run=rope_check)
    y = steps.add_parser("layers", help="per-layer error at aligned positions of snippets")
    _inputs(y)
    y.add_argument("--rows", action="append", required=True, help="as for diagnose")
    y.add_argument("--budget", type=int, default=4096)
    y.add_argument("--snippets", type=int, default=48)
    y.add_argument("--threads", type=int, default=None)
    y.add_argument("--out", type=Path)
    y.set_defaults(run=layers)
    g = steps.add_parser("general", help="next-token loss on general text, both readings")
    _inputs(g, meds=False)
    g.add_argument("--rows", action="append", required=True, help="as for diagnose")
    g.add_argument("--chunk", type=int, default=512)
    g.add_argument("--chunks", type=int, default=24)
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--out", type=Path)
    g.set_defaults(run=general)
    e = steps.add_parser("readings", help="diagnose readings paired on their shared points")
    e.add_argument("--reading", action="append", required=True, help="NAME=RUN.json[,...]:VARIANT")
    e.add_argument("--budget", type=int, required=True)
    e.add_argument("--resamples", type=int, default=1000)
    e.add_argument("--out", type=Path)
    e.set_defaults(run=readings)
    q = steps.add_parser("pair", help="artefacts paired on the same points")
    q.add_argument(
        "--original",
        required=True,
        help="REPORT.json:original or build_report.json@BUDGET:original",
    )
    q.add_argument(
        "--artefact",
        action="append",
        required=True,
        help="NAME=REPORT.json:medtpe[,REPORT.json:original] (after the comma: its own original "
        "run, e.g. the same dtype's, instead of --original's; the same records)",
    )
    q.add_argument("--floor", nargs=2, metavar="REPORT.json:MODE", help="served, then float32")
    q.add_argument("--resamples", type=int, default=1000)
    q.add_argument("--option", default="yes", help="the answer option whose logit shift is told")
    q.add_argument("--out", type=Path)
    q.set_defaults(run=pair)
    o = steps.add_parser("rounding", help="the served |Δp| split into the rows and two roundings")
    for side in ("float32", "served"):
        o.add_argument(
            f"--{side}",
            nargs=2,
            required=True,
            metavar=("ORIGINAL", "MEDTPE"),
            help="REPORT.json:MODE or build_report.json@BUDGET:MODE, the same records",
        )
    o.add_argument("--resamples", type=int, default=1000)
    o.add_argument("--option", default="yes", help="the answer option whose logit is split")
    o.add_argument("--out", type=Path)
    o.set_defaults(run=rounding)
    args = parser.parse_args(argv)
    if args.step == "diagnose" and not (args.rows or args.merged_keys or args.merged_keys_weighted):
        parser.error("diagnose reads --rows, --merged-keys(-weighted) or both")
    args.run(args)


if __name__ == "__main__":
    main()
