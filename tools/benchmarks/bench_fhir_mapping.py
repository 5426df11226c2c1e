"""FHIR R4 → MEDS mapping: throughput, its share of a record's preparation, the round trip on
every ICU stay, and coverage on a synthetic hospital's data.

    .venv/bin/clinosim simulate --country US --population 100 --seed 7 --output /tmp/clinosim \
        --format fhir-r4
    .venv/bin/python -m tools.benchmarks.bench_fhir_mapping \
        --meds ../shared/data/mimic-iv-demo-meds --clinosim /tmp/clinosim/fhir_r4 \
        --out tools/benchmarks/results/fhir_mapping.json

MIMIC part: the events of each labelled ICU stay (or of every `--every`-th) up to its prediction
time (its death left out: the mapping never reads it) become a FHIR Bundle
(`medtpe.core.fhir.from_meds`, not timed) sent through JSON; timed are `meds_from_fhir` (split into
`fhir.resources` parsing and the mapping itself) and the service's preparation of the same record
(`Predictor.prepare`: render within the budget, chat template, original and MedTPE tokenization).
Both records' engine ids are compared on every stay (the round trip). clinosim part: every patient's
Bundle of the NDJSON export, mapped; per resource type the share mapped, unmapped, skipped; Bundles
refused with the field.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import meds

from medtpe.batch.fhir_export import patient_bundles
from medtpe.core.fhir import FhirInputError, load_site_mapping, meds_from_fhir
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.fhir.parsing import parse_entries
from medtpe.core.meds import MedsDataset, SubjectEvents, read_labels
from medtpe.core.paths import default_artefact_dir, default_model_dir
from medtpe.core.prompt import ChatTemplate
from medtpe.core.tasks import get_task
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.predictor import Predictor
from tools.benchmarks.results_file import write_results


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": round(statistics.mean(values), 4),
        "p50": round(statistics.median(values), 4),
        "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 4),
        "max": round(max(values), 4),
    }


def mimic_part(meds_root: Path, budget: int, every: int = 1) -> dict[str, Any]:
    """Throughput, share and round trip on every `every`-th labelled ICU stay of `meds_root`."""
    dataset = MedsDataset.load(meds_root)
    points = read_labels(meds_root / "labels" / "icu_mortality.parquet")[::every]
    mapping = load_site_mapping()
    tokenizer = MedTPETokenizer.load(default_artefact_dir(), base=default_model_dir())
    predictor = Predictor(
        tokenizer,
        ChatTemplate.from_model_dir(default_model_dir()),
        "medtpe",
        budget,
        dataset.descriptions,
    )
    task = get_task("icu_mortality")
    rows = []
    for n, point in enumerate(points, 1):
        events = dataset.events(point.subject_id).before(point.prediction_time)
        events = events.take([code != meds.death_code for code in events.codes])
        bundle = json.loads(json.dumps(fhir_bundle_from_meds(events)))
        start = time.perf_counter()
        parse_entries(bundle)
        parse_s = time.perf_counter() - start
        start = time.perf_counter()
        record = meds_from_fhir(bundle, mapping=mapping, prediction_time=point.prediction_time)
        map_s = time.perf_counter() - start
        mapped = SubjectEvents.from_events(record.events)
        start = time.perf_counter()
        by_fhir = predictor.prepare(task, mapped, point.prediction_time, record.descriptions)
        prepare_s = time.perf_counter() - start
        by_meds = predictor.prepare(task, events, point.prediction_time)
        rows.append(
            {
                "subject_id": point.subject_id,
                "resources": len(bundle["entry"]),
                "events": len(record.events),
                "map_s": map_s,
                "parse_s": parse_s,
                "prepare_s": prepare_s,
                "same_ids": by_fhir.segmentation == by_meds.segmentation,
                "same_text": by_fhir.prompt.record_text == by_meds.prompt.record_text,
            }
        )
        print(f"{n}/{len(points)} stays", end="\r", file=sys.stderr)
    resources = sum(r["resources"] for r in rows)
    map_total = sum(r["map_s"] for r in rows)
    return {
        "records": len(rows),
        "budget": budget,
        "resources": resources,
        "resources_per_s": round(resources / map_total, 1),
        "parse_share_of_mapping": round(sum(r["parse_s"] for r in rows) / map_total, 3),
        "map_ms": _summary([1e3 * r["map_s"] for r in rows]),
        "prepare_ms": _summary([1e3 * r["prepare_s"] for r in rows]),
        "map_share_of_map_plus_prepare": round(
            map_total / (map_total + sum(r["prepare_s"] for r in rows)), 3
        ),
        "same_engine_ids": sum(r["same_ids"] for r in rows),
        "same_record_text": sum(r["same_text"] for r in rows),
        "per_record": rows,
    }


def clinosim_part(ndjson_dir: Path) -> dict[str, Any]:
    """Coverage and throughput on every patient of a clinosim NDJSON export."""
    mapping = load_site_mapping()
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    refused: Counter[str] = Counter()
    refused_resources: Counter[str] = Counter()
    patients = resources = 0
    elapsed = 0.0
    for bundle in patient_bundles(ndjson_dir):
        patients += 1
        start = time.perf_counter()
        try:
            record = meds_from_fhir(bundle, mapping=mapping)
        except FhirInputError as exc:
            refused[f"{exc.resource_type}.{exc.field}: {exc.message}"] += 1
            for entry in bundle["entry"]:
                refused_resources[entry["resource"]["resourceType"]] += 1
            continue
        elapsed += time.perf_counter() - start  # mapped Bundles only: resources/s of those
        resources += len(bundle["entry"])
        for name, values in record.counts.as_dict().items():
            counts[name].update(values)
    by_type = {}
    for name in sorted(counts):
        values = counts[name]
        total = sum(values.values())
        by_type[name] = {
            **dict(values),
            "total": total,
            "share_mapped": round(values["mapped"] / total, 3),
            "share_kept": round((values["mapped"] + values["unmapped"]) / total, 3),
        }
    return {
        "patients": patients,
        "bundles_mapped": patients - sum(refused.values()),
        "bundles_refused": dict(refused),
        "resources_in_refused_bundles": dict(refused_resources),
        "resources_mapped_bundles": resources,
        "resources_per_s": round(resources / elapsed, 1) if elapsed else None,
        "by_type": by_type,
    }


def main() -> None:
    """Run the parts asked for and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, help="MEDS dataset with ICU-mortality labels")
    parser.add_argument("--clinosim", type=Path, help="clinosim's fhir_r4 NDJSON directory")
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--every", type=int, default=1, help="every N-th labelled stay")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.meds:
        results["mimic"] = mimic_part(args.meds, args.budget, args.every)
        summary = {k: v for k, v in results["mimic"].items() if k != "per_record"}
        print(json.dumps(summary, indent=1))
    if args.clinosim:
        results["clinosim"] = clinosim_part(args.clinosim)
        print(json.dumps(results["clinosim"], indent=1))
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
