"""CDS hook latency beside `/predict` on the same held-out MIMIC-IV demo ICU stays, converted to
FHIR R4 (`medtpe.core.fhir.from_meds`, the MIMIC-IV-on-FHIR code systems), at each input budget.

Per budget one `medtpe serve` (real vLLM engine, the default model and artefact; other settings
from the environment) with an EHR allowed to call the hooks (an ES384 key, its JWK Set served on
127.0.0.1: tests/support/ehr.py). Per record, one after the other:

1. `predict`: `POST /predict` with the stay's MEDS events (no API key: the unsalted cache);
2. `hook_cold`: `patient-view` with every prefetch key answered from the stay's Bundle as an EHR's
   FHIR server would (one searchset per type), a JWT per call (the hooks' own cache salt, so
   nothing of step 1 is reused);
3. `predict_bundle`: `POST /predict` with the same stay as one FHIR Bundle (the same resources as
   the hook's prefetch, read the same way): what the hook adds to `/predict` on the same FHIR
   input is its own layer (JWT, prefetch, digest, card, audit); on a patient's first stay
   nothing of it is in the hook's resource cache, so the two map the same resources alike (run
   after the hook: the time texts the first pass memoises favour `/predict`);
4. `hook_reasked`: the same hook after one new Observation arrived (the newest one repeated a
   minute later): the score cache misses, the resource cache reads only the new Observation,
   vLLM's prefix cache serves the unchanged prompt start;
5. `hook_cached`: step 4's record again: answered from the score cache by the digest of the
   resources' text, no mapping, no model — the hook's own cost (JWT, body, digest, card) over
   HTTP.

Before that, without the engine, on every held-out stay: whether the prompt of the hook's events
(prefetch key by key) and that of the whole Bundle (`/predict`) are byte-identical to the MEDS
events' (`prompt_identity`; same lines in another order counted apart).

Reported per budget and step: client latency p50/p95 (each body encoded before the clock
starts: the client's JSON encoding is not the service's cost); the hook overhead over `/predict`
on the same record, p50 and p95 of the per-record differences, against `/predict` with the MEDS
events (`hook_overhead_ms`) and against `/predict` with the same FHIR Bundle
(`hook_overhead_vs_bundle_ms`; cold on a patient's first stay:
`hook_cold_overhead_vs_bundle_first_of_patient_ms`, the hook's own layer); the FHIR → MEDS
mapping's throughput (resources/s, every resource mapped in this process on the same prefetch,
no window, no cache; `mapping_share_of_hook_cold`: that time over `hook_cold`, per record, p50)
and the FHIR reading's share of the cold hook on a patient's first stay (`/predict` with the
Bundle − with the MEDS events, over `hook_cold`, per record, p50); and on every record both
sides' answers (p(yes), prediction) and prompt lengths (`checks`: the records whose prompt
length is `/predict`'s).

    .venv/bin/python -m tools.benchmarks.bench_cds_hooks --meds ../shared/data/mimic-iv-demo-meds \\
        --budgets 4096 8192 --records 8 --out tools/benchmarks/results/bench_cds_hooks.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from medtpe.core.cds.services import get_service
from medtpe.core.fhir import load_site_mapping, meds_from_fhir
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds.subject_split import HELD_OUT
from tests.support.cds_support import hook_request, patient_id, prefetch_of
from tests.support.ehr import Ehr, serving_ehr
from tools.benchmarks.bench_service import free_port, start_service, to_json_events
from tools.benchmarks.label_stays import label_stays
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"
SERVICE = get_service("medtpe-icu-mortality-patient-view")
STEPS = ("predict", "predict_bundle", "hook_cold", "hook_reasked", "hook_cached")
HOOK_STEPS = STEPS[2:]
"""The steps in the order reported; per stay they run as `run_budget` says."""
JSON = {"content-type": "application/json"}
MAX_BODY_BYTES = 64 * 2**20
"""A long stay's prefetch runs to megabytes (about 0.4 KB per Observation)."""
NO_FHIR_SERVER = "https://fhir.bench.invalid/r4"
"""The benchmark EHR's FHIR server: never fetched from (every call is prefetched)."""


def held_out_stays(meds: Path, n: int | None) -> list[dict[str, Any]]:
    """The first `n` held-out ICU stays (None: all): MEDS events up to the label's prediction
    time, and the same as a FHIR Bundle with the patient's prefetch."""
    stays = []
    for row, events in label_stays(meds, TASK, HELD_OUT):
        bundle = fhir_bundle_from_meds(events)
        patient = patient_id(bundle)
        stays.append(
            {
                "key": f"{row.subject_id}@{row.prediction_time.isoformat()}",
                "events": to_json_events(events),
                "patient": patient,
                "prefetch": prefetch_of(SERVICE, bundle, patient),
                "subject_events": events,
                "bundle": bundle,
            }
        )
        if len(stays) == n:
            break
    return stays


def grown(prefetch: dict[str, Any]) -> dict[str, Any]:
    """The prefetch with one new Observation: the newest one again, a minute later."""
    out = copy.deepcopy(prefetch)
    entries = out["observations"]["entry"]
    newest = copy.deepcopy(max(entries, key=lambda e: e["resource"]["effectiveDateTime"]))
    when = newest["resource"]["effectiveDateTime"].replace("Z", "")
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_epoch(when) + 60))
    newest["resource"] |= {"id": "bench-new-observation", "effectiveDateTime": later}
    entries.append(newest)
    return out


def _epoch(iso: str) -> float:
    from datetime import UTC, datetime

    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def mapping_rate(stays: list[dict[str, Any]]) -> dict[str, float]:
    """FHIR → MEDS mapping of each stay's prefetch, in this process: resources/s and ms/stay."""
    mapping = load_site_mapping(None)
    resources, seconds = 0, 0.0
    for stay in stays:
        flat = _resources(stay["prefetch"])
        start = time.perf_counter()
        meds_from_fhir(flat, mapping=mapping, patient_id=stay["patient"])
        stay["mapping_s"] = time.perf_counter() - start
        seconds += stay["mapping_s"]
        resources += len(flat)
        stay["n_resources"] = len(flat)
    return {
        "resources_per_s": resources / seconds,
        "ms_per_stay_mean": seconds / len(stays) * 1e3,
        "resources_per_stay_mean": resources / len(stays),
    }


def prompt_identity(meds: Path, stays: list[dict[str, Any]], budget: int) -> dict[str, int]:
    """Without the engine, per stay: is the prompt of the hook's resources (prefetch key by key,
    as JSON text, read as far as the prompt reaches: `medtpe.inference.record.FhirResources`)
    byte-identical to that of the MEDS events, and that of the whole Bundle, every resource read
    (`bundle`) and read as `/predict` reads it (`bundle_window`)?"""
    from medtpe.core.meds import SubjectEvents
    from medtpe.core.tasks import get_task
    from medtpe.inference.model import ModelConfig, load_model
    from medtpe.inference.record import FhirResources

    predictor = load_model(ModelConfig(codes_dir=meds, max_input_tokens=budget)).predictor
    mapping, task = load_site_mapping(None), get_task(TASK)

    def text(record: Any) -> str:
        events = SubjectEvents.from_events(record.events)
        return predictor.build([task], events, None, record.descriptions)[0][0].text

    def windowed(resources: Any, patient: str | None) -> str:
        record = FhirResources(resources, mapping, patient_id=patient)
        return record.prepare(predictor, task).prompt.text

    same = {"hook": 0, "bundle": 0, "hook_same_lines": 0, "bundle_window": 0}
    for stay in stays:
        by_meds = predictor.build([task], stay["subject_events"], None)[0][0].text
        flat = [json.dumps(r).encode() for r in _resources(stay["prefetch"])]
        by_hook = windowed(flat, stay["patient"])  # as the hook reads it: JSON text, the window
        same["hook"] += by_hook == by_meds
        same["hook_same_lines"] += sorted(by_hook.splitlines()) == sorted(by_meds.splitlines())
        same["bundle"] += text(meds_from_fhir(stay["bundle"], mapping=mapping)) == by_meds
        same["bundle_window"] += windowed(stay["bundle"], None) == by_meds
    return same | {"n_records": len(stays)}


def _resources(prefetch: dict[str, Any]) -> list[dict[str, Any]]:
    """A prefetch's resources in key order, as the hook reads them."""
    return [
        e.get("resource", e)
        for v in prefetch.values()
        if v is not None
        for e in (v.get("entry", []) if v["resourceType"] == "Bundle" else [v])
    ]


def probability(card: dict[str, Any]) -> float | None:
    found = re.search(r"\*\*Probability:\*\* ([0-9.]+)", card["detail"])
    return float(found.group(1)) if found else None


def prompt_tokens(card: dict[str, Any]) -> tuple[int, int]:
    found = re.search(r"([0-9,]+) → ([0-9,]+) prompt tokens", card["detail"])
    assert found, card["detail"]
    return int(found.group(1).replace(",", "")), int(found.group(2).replace(",", ""))


@contextmanager
def serving(args: argparse.Namespace, budget: int, ehr: Ehr) -> Iterator[str]:
    """The service at `budget` on 127.0.0.1, its base URL: `medtpe serve` on vLLM, or with
    `--engine instant` the app in this process on the instant engine (what the hook costs
    around the engine)."""
    port = free_port()
    env = {
        "MEDTPE_CDS_BASE_URL": f"http://127.0.0.1:{port}",
        "MEDTPE_MAX_INPUT_TOKENS": str(budget),
        "MEDTPE_CODES_DIR": str(args.meds.resolve()),
        "MEDTPE_CDS_ISSUERS": ehr.issuers_setting([NO_FHIR_SERVER]),
        "MEDTPE_REQUEST_TIMEOUT_S": "3600",
        "MEDTPE_MAX_REQUEST_BYTES": str(MAX_BODY_BYTES),
    }
    if args.engine == "instant":
        from medtpe.service.settings import ServiceSettings
        from tests.support.service_support import served_in_thread

        os.environ.update(env)  # read as the service reads them (JSON settings parsed)
        with served_in_thread(ServiceSettings(), port=port) as url:
            yield url
        return
    process = start_service(env, port, args.logs / f"cds-hooks-{budget}.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(120)


def run_budget(
    args: argparse.Namespace, budget: int, stays: list[dict[str, Any]], ehr: Ehr
) -> dict[str, Any]:
    """One service at `budget`: every step on every stay (the cold hook before `/predict` with
    the same Bundle, so that times the first pass memoises favour `/predict`, not the hook)."""
    records, seen = [], set()
    with serving(args, budget, ehr) as base, httpx.Client(timeout=3600) as client:
        hook_url = f"{base}/cds-services/{SERVICE.id}"

        def predict(row: dict[str, Any], step: str, field: str, record: Any) -> None:
            body = {"task": TASK, field: record, "options": {"return_probabilities": True}}
            content = json.dumps(body).encode()  # encoded before the clock starts, as below
            start = time.perf_counter()
            answer = client.post(f"{base}/predict", content=content, headers=JSON)
            row[f"{step}_s"] = time.perf_counter() - start
            answer.raise_for_status()
            predicted = answer.json()
            row[step] = {
                "p_yes": (predicted["probabilities"] or {}).get("yes"),
                "prediction": predicted["prediction"],
                "tokens": [predicted["tokens"]["original"], predicted["tokens"]["medtpe"]],
            }

        def hook(row: dict[str, Any], step: str, patient: str, prefetch: Any) -> None:
            request = hook_request(SERVICE, patient, prefetch=prefetch)
            content = json.dumps(request).encode()
            headers = JSON | ehr.authorization(hook_url)
            start = time.perf_counter()
            answer = client.post(hook_url, content=content, headers=headers)
            row[f"{step}_s"] = time.perf_counter() - start
            answer.raise_for_status()
            card = answer.json()["cards"][0]
            row[step] = {
                "p_yes": probability(card),
                "indicator": card["indicator"],
                "tokens": list(prompt_tokens(card)),
                "cached": "an earlier call's score" in card["detail"],
            }

        for stay in stays:
            row: dict[str, Any] = {"key": stay["key"], "n_resources": stay["n_resources"]}
            row["first_of_patient"] = stay["patient"] not in seen  # no resource of it cached
            seen.add(stay["patient"])
            row["mapping_s"] = stay["mapping_s"]
            predict(row, "predict", "events", stay["events"])
            hook(row, "hook_cold", stay["patient"], stay["prefetch"])
            predict(row, "predict_bundle", "bundle", stay["bundle"])
            later = grown(stay["prefetch"])
            hook(row, "hook_reasked", stay["patient"], later)
            hook(row, "hook_cached", stay["patient"], later)
            records.append(row)
            print(budget, {k: round(v, 3) for k, v in row.items() if k.endswith("_s")})
    return summarize(budget, records)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values` (nearest rank).

    >>> percentile([3.0, 1.0, 2.0], 0.5)
    2.0
    """
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(budget: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Latency percentiles per step, the hook's overhead and the answers compared."""
    latency = {
        step: {
            "p50_ms": percentile([r[f"{step}_s"] for r in records], 0.5) * 1e3,
            "p95_ms": percentile([r[f"{step}_s"] for r in records], 0.95) * 1e3,
        }
        for step in STEPS
    }

    def over(base: str) -> dict[str, dict[str, float]]:
        return {
            step: {
                "p50_ms": percentile([r[f"{step}_s"] - r[f"{base}_s"] for r in records], 0.5) * 1e3,
                "p95_ms": percentile([r[f"{step}_s"] - r[f"{base}_s"] for r in records], 0.95)
                * 1e3,
            }
            for step in HOOK_STEPS
        }

    first = [r for r in records if r["first_of_patient"]]

    def cold_first(base: str) -> dict[str, float]:
        over = [r["hook_cold_s"] - r[f"{base}_s"] for r in first]
        return {
            "n": len(first),
            "p50_ms": percentile(over, 0.5) * 1e3,
            "p95_ms": percentile(over, 0.95) * 1e3,
        }

    same_tokens = sum(r["hook_cold"]["tokens"] == r["predict"]["tokens"] for r in records)
    same_bundle = sum(r["predict_bundle"]["tokens"] == r["predict"]["tokens"] for r in records)
    dp = [
        abs(r["hook_cold"]["p_yes"] - r["predict"]["p_yes"])
        for r in records
        if r["hook_cold"]["p_yes"] is not None and r["predict"]["p_yes"] is not None
    ]
    return {
        "budget": budget,
        "n_records": len(records),
        "latency": latency,
        "hook_overhead_ms": over("predict"),
        "hook_overhead_vs_bundle_ms": over("predict_bundle"),
        # nothing of the patient in any cache: what the hook adds to /predict on the same input
        "hook_cold_overhead_first_of_patient_ms": cold_first("predict"),
        "hook_cold_overhead_vs_bundle_first_of_patient_ms": cold_first("predict_bundle"),
        # every resource mapped in this process (no window, no cache) against the cold hook
        "mapping_share_of_hook_cold": percentile(
            [r["mapping_s"] / r["hook_cold_s"] for r in records], 0.5
        ),
        # what reading the FHIR record (first pass, the window's validation and mapping) costs
        # /predict over its MEDS events, against the cold hook: its share of the hook's time
        "fhir_share_of_hook_cold_first_of_patient": percentile(
            [(r["predict_bundle_s"] - r["predict_s"]) / r["hook_cold_s"] for r in first], 0.5
        ),
        "checks": {
            "same_prompt_tokens_as_predict": same_tokens,
            "bundle_same_prompt_tokens_as_predict": same_bundle,
            "p_yes_abs_diff_max": max(dp) if dp else None,
            "p_yes_abs_diff_mean": statistics.mean(dp) if dp else None,
            "cached_steps_from_cache": sum(r["hook_cached"]["cached"] for r in records),
            "reasked_steps_from_cache": sum(r["hook_reasked"]["cached"] for r in records),
        },
        "records": records,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--records", type=int, default=8, help="stays timed (identity: all)")
    parser.add_argument("--logs", type=Path, default=Path(".cache/bench-logs"))
    parser.add_argument(
        "--engine",
        choices=["vllm", "instant"],
        default="vllm",
        help="instant: the app in this process on the instant engine (the hook's own cost)",
    )
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    every_stay = held_out_stays(args.meds, None)
    stays = every_stay[: args.records]
    mapping = mapping_rate(stays)
    identity = {b: prompt_identity(args.meds, every_stay, b) for b in args.budgets}
    print("prompt identity:", identity)
    results: dict[str, Any] = {"mapping": mapping, "prompt_identity": identity, "budgets": []}
    with serving_ehr() as ehr:
        for budget in args.budgets:
            load_before = [round(x, 2) for x in os.getloadavg()]
            summary = run_budget(args, budget, stays, ehr)
            summary["engine"] = args.engine
            summary["load_avg"] = {
                "before": load_before,
                "after": [round(x, 2) for x in os.getloadavg()],
            }
            results["budgets"].append(summary)
            print(json.dumps({k: v for k, v in summary.items() if k != "records"}, indent=1))
    command = "python -m tools.benchmarks.bench_cds_hooks " + " ".join(sys.argv[1:])
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
