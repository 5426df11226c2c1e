"""What the shared state (medtpe/service/cds_hooks/state_store.py) adds to a CDS hook call: the same
records through the `patient-view` hook with the state in the API process's memory and on a Redis
server (`MEDTPE_STATE_URL`), beside `/predict` with the same FHIR Bundle.

Two instances of the app run at once in this process on the instant engine (the model's time is
not what is measured), each served by uvicorn on 127.0.0.1 (`served_in_thread`): `local` keeps
the `jti`s and scores in memory, `redis` on a redis-server this script starts (127.0.0.1, no
persistence). Every record is a distinct synthetic ICU record (MEDS events as the tests make
them, converted to FHIR R4 by `medtpe.core.fhir.from_meds`), so each hook call runs the whole
path: the `jti` claimed, two score-cache misses, the record mapped and scored, the score kept
under both keys in one pipeline (four round trips to Redis). Per record: the hook on both
instances (which first alternates), then `/predict` with the record's Bundle on the `local`
instance; each body encoded and each JWT signed before the clock starts.

Reported: p50/p95 per side, the paired per-record differences (Redis − in-memory, and each
hook − `/predict`), and on every record whether both hooks' cards give `/predict`'s answer
(p(yes) to the card's two decimals, the prompt's token counts). Also the state's own part of a
call, timed alone on each store (`state_operations`: one `jti` claimed through the replay
cache, two score misses, two scores kept in one round trip, as a hook call on a new record does).

    .venv/bin/python -m tools.benchmarks.bench_hook_state --records 200 \\
        --out tools/benchmarks/results/bench_hook_state.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from medtpe.core.cds.cards import Score
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.service.cds_hooks.jwt_auth import ReplayCache
from medtpe.service.cds_hooks.state_store import LocalStore, RedisStore, ScoreStore, StateStore
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import hook_request, patient_id, prefetch_of
from tests.support.ehr import serving_ehr
from tests.support.redis_server import STATE_KEY, running_redis
from tests.support.service_support import served_in_thread, synthetic_events
from tools.benchmarks.bench_cds_hooks import SERVICE, TASK, percentile, probability, prompt_tokens
from tools.benchmarks.results_file import write_results

SIDES = ("hook_local", "hook_redis", "predict")
JSON = {"content-type": "application/json"}
PUBLIC_BASE = "https://cds.bench.invalid"
"""The instances' `MEDTPE_CDS_BASE_URL`: what each JWT's `aud` names."""
FHIR_SERVERS = ["http://127.0.0.1:9/fhir"]
"""The issuer's FHIR servers (none is called: every call is prefetched)."""
FIRST_SUBJECT = 10_000


def records(n: int, n_events: int) -> list[dict[str, Any]]:
    """`n` distinct synthetic ICU records: their Bundle and their hook's prefetch."""
    out = []
    for subject in range(FIRST_SUBJECT, FIRST_SUBJECT + n):
        events = [MedsEvent.model_validate(e) for e in synthetic_events(subject, n_events)]
        bundle = fhir_bundle_from_meds(SubjectEvents.from_events(events))
        patient = patient_id(bundle)
        prefetch = prefetch_of(SERVICE, bundle, patient)
        out.append({"bundle": bundle, "patient": patient, "prefetch": prefetch})
    return out


def sample_score() -> Score:
    """A score as a hook call on a synthetic record keeps it (sizes and kinds of its fields)."""
    when = datetime(2150, 3, 1, 8, 0)
    return Score(
        *("ICU mortality", "Will the patient die in the ICU?", 0.75, when, 63, 63, when, when),
        *(1024, 800, 560, 0.3, "SmolLM2-135M-Instruct", "medtpe", "a" * 16),
        datetime.now(UTC),
        {"resources": 70, "mapped": 60, "unmapped": 0, "skipped": 10},
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both instances up, every record through both hooks and `/predict`; then the state
    operations alone on each store."""
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        ehr = stack.enter_context(serving_ehr())
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-state-")))
        redis = stack.enter_context(running_redis(logs))
        common = {
            "cds_issuers": json.loads(ehr.issuers_setting(FHIR_SERVERS)),
            "cds_base_url": PUBLIC_BASE,
            "max_input_tokens": args.budget,
            "max_request_bytes": 64 * 2**20,
        }
        urls = {
            "hook_local": stack.enter_context(served_in_thread(ServiceSettings(**common))),
            "hook_redis": stack.enter_context(
                served_in_thread(
                    ServiceSettings(**common, state_url=redis.url, state_key=STATE_KEY)
                )
            ),
        }
        client = stack.enter_context(httpx.Client(timeout=120))
        path = f"/cds-services/{SERVICE.id}"

        def hook(row: dict[str, Any], side: str, record: dict[str, Any]) -> None:
            request = hook_request(SERVICE, record["patient"], prefetch=record["prefetch"])
            content = json.dumps(request).encode()
            headers = JSON | ehr.authorization(PUBLIC_BASE + path)
            start = time.perf_counter()
            answer = client.post(urls[side] + path, content=content, headers=headers)
            row[f"{side}_s"] = time.perf_counter() - start
            answer.raise_for_status()
            card = answer.json()["cards"][0]
            row[side] = {"p_yes": probability(card), "tokens": list(prompt_tokens(card))}

        def predict(row: dict[str, Any], record: dict[str, Any]) -> None:
            body = {"task": TASK, "bundle": record["bundle"]}
            content = json.dumps(body | {"options": {"return_probabilities": True}}).encode()
            start = time.perf_counter()
            answer = client.post(urls["hook_local"] + "/predict", content=content, headers=JSON)
            row["predict_s"] = time.perf_counter() - start
            answer.raise_for_status()
            predicted = answer.json()
            p_yes = (predicted["probabilities"] or {}).get("yes")
            row["predict"] = {
                "p_yes": None if p_yes is None else round(p_yes, 2),
                "tokens": [predicted["tokens"]["original"], predicted["tokens"]["medtpe"]],
            }

        for i, record in enumerate(records(args.warmup + args.records, args.events)):
            row: dict[str, Any] = {"redis_first": i % 2 == 1}
            for side in ("hook_redis", "hook_local") if row["redis_first"] else SIDES[:2]:
                hook(row, side, record)
            predict(row, record)
            if i >= args.warmup:
                rows.append(row)
        stores: dict[str, StateStore] = {
            "local": LocalStore(10_000),
            "redis": RedisStore(redis.url),
        }
        operations = {
            name: figures(asyncio.run(state_operations(store, args.state_calls, sample_score())))
            for name, store in stores.items()
        }
    return summarize(rows) | {"state_operations": operations}


async def state_operations(store: StateStore, n: int, score: Score) -> list[float]:
    """Seconds of each of `n` hook calls' state operations on `store`: a `jti` claimed, two
    score misses, two scores kept at once (as a call on a new record does them)."""
    replays, scores = ReplayCache(store), ScoreStore(store, STATE_KEY.encode(), ttl_s=60)
    seconds = []
    for i in range(n):
        start = time.perf_counter()
        assert await replays.first_use("https://ehr.bench.invalid", f"jti-{i}", time.time() + 300)
        for kind in ("sent", "events"):
            assert await scores.get("issuer", "tenant", kind, str(i)) is None
        kinds = ("events", "sent")
        await scores.put(score, *(("issuer", "tenant", k, str(i)) for k in kinds))
        seconds.append(time.perf_counter() - start)
    if isinstance(store, RedisStore):
        await store.aclose()
    return seconds


def figures(values: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds."""
    return {"p50_ms": percentile(values, 0.5) * 1e3, "p95_ms": percentile(values, 0.95) * 1e3}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 per side, the paired differences, the answers compared."""
    pairs = {
        "hook_redis_minus_hook_local": ("hook_redis", "hook_local"),
        "hook_redis_minus_predict": ("hook_redis", "predict"),
        "hook_local_minus_predict": ("hook_local", "predict"),
    }
    same = {
        side: sum(r[side] == r["predict"] for r in rows) for side in ("hook_local", "hook_redis")
    }
    return {
        "n_records": len(rows),
        "latency": {side: figures([r[f"{side}_s"] for r in rows]) for side in SIDES},
        "paired_difference": {
            name: figures([r[f"{a}_s"] - r[f"{b}_s"] for r in rows])
            for name, (a, b) in pairs.items()
        },
        "same_answer_as_predict": same,
        "records": rows,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200, help="records timed")
    parser.add_argument("--warmup", type=int, default=10, help="records sent first, not timed")
    parser.add_argument("--events", type=int, default=60, help="events per synthetic record")
    parser.add_argument("--budget", type=int, default=1024, help="input budget (tokens)")
    parser.add_argument(
        "--state-calls", type=int, default=2000, help="calls' state operations timed alone"
    )
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = run(args)
    results["load_avg"] = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps({k: v for k, v in results.items() if k != "records"}, indent=1))
    command = "python -m tools.benchmarks.bench_hook_state " + " ".join(sys.argv[1:])
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
