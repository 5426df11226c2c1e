"""`medtpe predict --fhir`: the grouping's memory and speed as the export grows, the mapping's
speed beside the engine's, and the same predictions through `--meds`, `--fhir` and `--fhir --ray`.

    .venv/bin/python -m tools.benchmarks.bench_bulk_fhir --meds ../shared/data/mimic-iv-demo-meds \\
        --copies 10 --work-dir /tmp/bulk --out tools/benchmarks/results/bulk_fhir.json

1. The export: every subject of the MIMIC-IV demo as FHIR R4 (`medtpe.core.fhir.from_meds`,
   the whole record, death left to `Patient.deceasedDateTime`), written as a Bulk Data export (one
   NDJSON file per type); `--copies K`: K copies of it (each copy's patient ids and MEDS subject
   identifiers moved), the export grown K times.
2. Grouping (a fresh process per run, its peak RSS from `getrusage`, the RSS after its imports
   beside it): the on-disk partition (`medtpe.batch.fhir_export`, the bucket size `--bucket-mib`) at
   1x and Kx and, as the reference, the in-memory grouping it replaced (every resource parsed and
   held) at 1x and `--reference-copies`; resources per second of each.
3. The mapping: each labelled ICU stay's patient read from the partition and prepared as the job
   prepares it (`FhirWindow` + `prepare_fhir`: first pass over every resource, the newest read
   and mapped, render, both tokenizations), resources per second and records per second.
4. `medtpe predict` on the labelled stays, as real commands in fresh processes (vLLM on this
   CPU, `--max-input-tokens`): `--meds` (the MEDS events), `--fhir` (the export) and `--fhir
   --ray --ray-cpus N`; per record, whether prediction, answer text, token counts and p(yes)
   agree between them (`--parts agree`: only this, from the runs in `--work-dir`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from medtpe.batch.task_outputs import SUMMARY_FILE
from tools.benchmarks.bench_predict import agreement, run_command, run_records, run_system
from tools.benchmarks.results_file import write_results

SUBJECT_OFFSET = 100_000_000
"""Copy k's MEDS subject ids are the demo's plus k times this."""
PATIENT_REFERENCE = re.compile(rb'"Patient/([0-9a-f-]{36})"')


def write_demo_export(meds: Path, out: Path) -> dict[str, int]:
    """The MEDS dataset's subjects as one NDJSON file per resource type; resources by type."""
    from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
    from medtpe.core.meds import MedsDataset

    dataset = MedsDataset.load(meds)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    counts: dict[str, int] = defaultdict(int)
    try:
        for subject in dataset.subject_ids:
            for entry in fhir_bundle_from_meds(dataset.events(subject))["entry"]:
                kind = entry["resource"]["resourceType"]
                if kind not in files:
                    files[kind] = (out / f"{kind}.ndjson").open("w", encoding="utf-8")
                files[kind].write(json.dumps(entry["resource"]) + "\n")
                counts[kind] += 1
    finally:
        for file in files.values():
            file.close()
    return dict(counts)


def write_copies(export: Path, copies: int, out: Path) -> None:
    """`copies` copies of `export` in `out`, copy k's patients renamed (`<id>-k<k>`) and their
    MEDS subject identifiers moved by k * SUBJECT_OFFSET (copy 0: the export itself)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(export.glob("*.ndjson")):
        with path.open("rb") as source, (out / path.name).open("wb") as sink:
            lines = source.readlines()
            for k in range(copies):
                for line in lines:
                    sink.write(_copied(line, k) if k else line)


def _copied(line: bytes, k: int) -> bytes:
    if line.startswith(b'{"resourceType": "Patient"'):
        patient = json.loads(line)
        patient["id"] = f"{patient['id']}-k{k}"
        for identifier in patient.get("identifier", []):
            identifier["value"] = str(int(identifier["value"]) + k * SUBJECT_OFFSET)
        return json.dumps(patient).encode() + b"\n"
    return PATIENT_REFERENCE.sub(lambda m: b'"Patient/%s-k%d"' % (m.group(1), k), line)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def group_in_child(export: Path, how: str, bucket_mib: int, work: Path) -> dict[str, Any]:
    """`--measure` of one grouping in a fresh process (its own peak RSS)."""
    command = [sys.executable, "-m", "tools.benchmarks.bench_bulk_fhir", "--measure", how]
    command += ["--export", str(export), "--bucket-mib", str(bucket_mib), "--work-dir", str(work)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(how: str, export: Path, bucket_mib: int, work: Path) -> dict[str, Any]:
    """One grouping of `export` (`partition` or `in_memory`), every patient's resources visited;
    its times, counts and peak RSS."""
    from medtpe.batch.fhir_export import export_files, partition_export
    from medtpe.core.fhir import load_site_mapping

    mapping = load_site_mapping()
    files = export_files(export)
    imported = _rss_mib()
    start = time.perf_counter()
    patients = resources = largest = 0
    if how == "partition":
        partition = partition_export(
            files, work, mapping=mapping, bucket_bytes=bucket_mib * 2**20, progress=False
        )
        passed = time.perf_counter()
        for bucket in range(partition.n_buckets):
            for _, found in partition.patients_of(bucket):
                patients += 1
                resources += len(found.lines)
                largest = max(largest, len(found.lines))
        extra = {"buckets": partition.n_buckets, "pass_s": round(passed - start, 2)}
    else:  # the grouping `medtpe.core.fhir.bulk` did: every resource parsed and held
        owned: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for file in files:
            with file.path.open("rb") as lines:
                for line in lines:
                    parsed = json.loads(line)
                    reference = (parsed.get("subject") or {}).get("reference", "")
                    key = parsed["id"] if parsed["resourceType"] == "Patient" else reference[8:]
                    owned[key].append(parsed)
        for found in owned.values():
            patients += 1
            resources += len(found)
            largest = max(largest, len(found))
        extra = {}
    seconds = time.perf_counter() - start
    return {
        "how": how,
        "export_mib": round(sum(f.path.stat().st_size for f in files) / 2**20, 1),
        "patients": patients,
        "resources": resources,
        "largest_patient_resources": largest,
        "seconds": round(seconds, 2),
        "resources_per_s": round(resources / seconds),
        "rss_after_imports_mib": round(imported, 1),
        "peak_rss_mib": round(_rss_mib(), 1),
        **extra,
    }


def mapping_speed(export: Path, meds: Path, labels: Path, budget: int, work: Path) -> dict:
    """Each labelled stay's patient prepared as the job prepares it; resources/s and records/s."""
    from medtpe.batch.fhir_export import export_files, partition_export
    from medtpe.batch.fhir_job import prepare_patient
    from medtpe.core.fhir import load_site_mapping
    from medtpe.core.meds import read_labels
    from medtpe.core.tasks import get_task
    from medtpe.inference.model import ModelConfig, load_model

    mapping = load_site_mapping()
    predictor = load_model(ModelConfig(codes_dir=meds, max_input_tokens=budget)).predictor
    task = get_task("icu_mortality")
    partition = partition_export(export_files(export), work, mapping=mapping, progress=False)
    by_subject = {s: p for p, s in partition.subjects().items()}
    wanted = read_labels(labels)
    grouped = {
        patient: found
        for bucket in range(partition.n_buckets)
        for patient, found in partition.patients_of(bucket)
    }
    resources, seconds = 0, 0.0
    for point in wanted:
        patient = by_subject[point.subject_id]
        start = time.perf_counter()
        prepare_patient(
            predictor, [task], mapping, patient, grouped[patient], point.prediction_time
        )
        seconds += time.perf_counter() - start
        resources += len(grouped[patient].lines)
    return {
        "records": len(wanted),
        "resources": resources,
        "seconds": round(seconds, 2),
        "resources_per_s": round(resources / seconds),
        "records_per_s": round(len(wanted) / seconds, 2),
        "max_input_tokens": budget,
    }


def predict_fhir(export: Path, args: argparse.Namespace, out: Path, ray: bool) -> dict[str, Any]:
    """`medtpe predict --fhir` through `bench_predict.run_system` (its command, figures)."""
    from medtpe.cli.command_line import medtpe_command

    command = medtpe_command(
        "predict",
        fhir=export,
        codes=args.meds,
        labels=args.meds / "labels" / "icu_mortality.parquet",
        task="icu_mortality",
        out=out,
        max_input_tokens=args.max_input_tokens,
        kv_cache_gib=args.kv_cache_gib,
    )
    if ray:
        command += ["--ray", "--ray-cpus", str(args.ray_cpus)]
    figures = run_command(command, out)
    run = json.loads((out / SUMMARY_FILE).read_text())["this_run"]
    grouping = {k: run["fhir_export"][k] for k in ("lines", "seconds", "resources_per_s")}
    return {**figures, "grouping": grouping}


def agreements(work: Path) -> dict[str, Any]:
    """How the `predict` runs under `work` agree (`bench_predict.agreement`): each FHIR run with
    the MEDS run, `--ray` with the local FHIR run; and the records whose prompts' token counts
    differ between MEDS and FHIR (subject, prediction time, both counts)."""
    pairs = {
        "fhir_vs_meds": ("meds", "fhir"),
        "fhir_ray_vs_meds": ("meds", "fhir_ray"),
        "fhir_ray_vs_fhir": ("fhir", "fhir_ray"),
    }
    done = {
        s for s in ("meds", "fhir", "fhir_ray") if (work / f"predict-{s}" / SUMMARY_FILE).is_file()
    }
    found: dict[str, Any] = {
        name: agreement(work / f"predict-{a}", work / f"predict-{b}")
        for name, (a, b) in pairs.items()
        if {a, b} <= done
    }
    if {"meds", "fhir"} <= done:
        meds, fhir = (run_records(work / f"predict-{s}") for s in ("meds", "fhir"))
        found["token_counts_differ"] = [
            {
                "record": r,
                "subject_id": meds[r]["subject_id"],
                "prediction_time": str(meds[r]["prediction_time"]),
                "meds": [meds[r]["original_tokens"], meds[r]["medtpe_tokens"]],
                "fhir": [fhir[r]["original_tokens"], fhir[r]["medtpe_tokens"]],
            }
            for r in sorted(meds)
            if r in fhir
            and (meds[r]["original_tokens"], meds[r]["medtpe_tokens"])
            != (fhir[r]["original_tokens"], fhir[r]["medtpe_tokens"])
        ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meds", type=Path)
    parser.add_argument("--task", default="icu_mortality", help=argparse.SUPPRESS)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument(
        "--reference-copies",
        type=int,
        default=3,
        help="The in-memory grouping's larger export (it holds all of it: 10x needs ~10 GiB).",
    )
    parser.add_argument("--bucket-mib", type=int, default=256)
    parser.add_argument("--max-input-tokens", type=int, default=1024)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count())
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["group", "map", "predict", "agree"],
        default=["group", "map", "predict"],
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=["meds", "fhir", "fhir_ray"],
        default=["meds", "fhir", "fhir_ray"],
    )
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--measure", choices=["partition", "in_memory"], help=argparse.SUPPRESS)
    parser.add_argument("--export", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_bulk_fhir_"))
    if args.measure:
        print(json.dumps(measure(args.measure, args.export, args.bucket_mib, work)))
        return

    export = work / "export-1x"
    if not (export / "Patient.ndjson").is_file():
        write_demo_export(args.meds, export)
    grown = work / f"export-{args.copies}x"
    if not (grown / "Patient.ndjson").is_file():
        write_copies(export, args.copies, grown)
    results: dict[str, Any] = {"copies": args.copies, "bucket_mib": args.bucket_mib}
    if "group" in args.parts:
        reference = work / f"export-{args.reference_copies}x"
        if not (reference / "Patient.ndjson").is_file():
            write_copies(export, args.reference_copies, reference)
        runs = []
        for how, sizes in (
            ("partition", ((1, export), (args.copies, grown))),
            ("in_memory", ((1, export), (args.reference_copies, reference))),
        ):
            for copies, directory in sizes:
                run = group_in_child(
                    directory, how, args.bucket_mib, work / f"group-{how}-{copies}"
                )
                runs.append({"copies": copies, **run})
                print(json.dumps(runs[-1]))
        results["grouping"] = runs
    if "map" in args.parts:
        labels = args.meds / "labels" / "icu_mortality.parquet"
        results["mapping"] = mapping_speed(
            export, args.meds, labels, args.max_input_tokens, work / "map"
        )
        print(json.dumps(results["mapping"]))
    if "predict" in args.parts:
        labels = args.meds / "labels" / "icu_mortality.parquet"
        runs = {
            "meds": lambda out: run_system("local", args.meds, labels, out, args),
            "fhir": lambda out: predict_fhir(export, args, out, ray=False),
            "fhir_ray": lambda out: predict_fhir(export, args, out, ray=True),
        }
        results["predict"] = {
            system: runs[system](work / f"predict-{system}") for system in args.systems
        }
        print(json.dumps(results["predict"], indent=1))
    if "predict" in args.parts or "agree" in args.parts:
        results["agreement"] = agreements(work)
        print(json.dumps(results["agreement"], indent=1))
    command = shlex.join(
        [".venv/bin/python", "-m", "tools.benchmarks.bench_bulk_fhir", *sys.argv[1:]]
    )
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
