"""`medtpe predict` over every ICU stay of a MEDS dataset, locally and on a local Ray cluster.

    .venv/bin/python -m tools.benchmarks.bench_predict \\
        --meds ../shared/data/mimic-iv-demo-meds \\
        --labels ../shared/data/mimic-iv-demo-meds/labels/icu_mortality.parquet \\
        --max-input-tokens 1024 --systems local ray --out tools/benchmarks/results/predict.json

Each system is the real command (`medtpe predict`, `--ray --ray-cpus N` for Ray) in a fresh
process writing into its own directory, so both pay their engine start. Reported per system:
wall time of the whole command, records/s over it (and over scoring alone for the local job, whose
summary separates the engine start), peak memory (the summed RSS of the command's process tree
and its largest process, sampled every 0.5 s by `tools.benchmarks.process_tree`: Ray's own
processes included), both tokenizers' token totals from the summary, and how many records the
systems answered identically.

`--repeat K` scores a dataset of K copies of the shared MIMIC-IV demo (each copy's subjects
renumbered and its numbers' digits rotated, so no prompt repeats and the prefix cache cannot help;
each copy one shard, as the mining benchmarks make them), with the labels of `--labels` repeated
to match, to show the job's memory does not grow with the records.

`--several-tasks a,b,c,d` measures the night job asked several tasks per record instead: the
local command on the held-out subjects with `--times last` (no labels: a label file labels one
task), for the first task alone, then for every task (each record read and rendered once,
`medtpe predict --task a,b,c,d`), one after the other on the same records; their wall and
scoring times, the ratio, and how often the first task's answers agree (the several-task run
renders the record within what the longest task's text leaves, so a long record may start later
there).

    .venv/bin/python -m tools.benchmarks.bench_predict --meds ../shared/data/mimic-iv-demo-meds \
        --several-tasks icu_mortality,phenotyping,readmission_30d,pancreatic_cancer_1y \
        --max-input-tokens 8192 --out tools/benchmarks/results/predict_tasks.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.batch.rows import read_records
from medtpe.batch.task_outputs import RECORDS_SUFFIX, SUMMARY_FILE
from medtpe.cli.command_line import medtpe_command
from tools.benchmarks.bench_tokenizer_data import SUBJECT_OFFSET, write_shards
from tools.benchmarks.process_tree import TreeSampler
from tools.benchmarks.results_file import write_results


def repeated_dataset(labels: Path, copies: int, out: Path) -> tuple[Path, Path]:
    """The shared demo's data as `copies` shards (`write_shards`: shard k's subjects moved by
    k * SUBJECT_OFFSET, its numbers' digits rotated by k) and `labels` repeated to match."""
    write_shards(out, copies)
    table = pq.read_table(labels)
    subjects = table.schema.get_field_index("subject_id")
    moved = [
        table.set_column(subjects, "subject_id", pc.add(table.column(subjects), k * SUBJECT_OFFSET))
        for k in range(copies)
    ]
    all_labels = out / "labels.parquet"
    pq.write_table(pa.concat_tables(moved), all_labels)
    return out, all_labels


def run_system(
    system: str, meds: Path, labels: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One `medtpe predict` run of `system` (local / ray); its figures."""
    command = medtpe_command(
        "predict",
        meds=meds,
        labels=labels,
        task=args.task,
        out=out,
        max_input_tokens=args.max_input_tokens,
        kv_cache_gib=args.kv_cache_gib,
    )
    if system == "ray":
        command += ["--ray", "--ray-cpus", str(args.ray_cpus)]
    return run_command(command, out)


def run_tasks(tasks: str, meds: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One local `medtpe predict --task TASKS --times last --split held_out` run; its figures."""
    command = medtpe_command(
        "predict",
        meds=meds,
        task=tasks,
        times="last",
        split="held_out",
        out=out,
        max_input_tokens=args.max_input_tokens,
        kv_cache_gib=args.kv_cache_gib,
    )
    return run_command(command, out)


def several_tasks(meds: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The first of `--several-tasks` alone against all of them, on the same records."""
    first = args.several_tasks.split(",")[0]
    one = run_tasks(first, meds, work / "one", args)
    print("one task", json.dumps(one, indent=1))
    several = run_tasks(args.several_tasks, meds, work / "several", args)
    print("several tasks", json.dumps(several, indent=1))
    return {
        "tasks": args.several_tasks.split(","),
        "one_task": one,
        "several_tasks": several,
        "several_over_one_wall": round(several["wall_s"] / one["wall_s"], 3),
        "several_over_one_scoring": round(several["scoring_s"] / one["scoring_s"], 3),
        "first_task_agreement": agreement(work / "one", work / "several" / first),
    }


def run_command(command: list[str], out: Path) -> dict[str, Any]:
    """One `medtpe predict` command writing into `out`, in a fresh process; its figures."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    start = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        sampler = TreeSampler(process.pid)
        code = process.wait()
    wall = time.perf_counter() - start
    usage = sampler.stop()
    if code != 0:
        raise RuntimeError(f"{shlex.join(command)} failed ({code}); see {log}")
    summary = json.loads((out / SUMMARY_FILE).read_text())
    run = summary["this_run"]
    return {
        "command": shlex.join(command),
        "records": summary["records"],
        "failures": summary["failures"],
        "failure_kinds": summary["failure_kinds"],
        "original_tokens": summary["original_tokens"],
        "medtpe_tokens": summary["medtpe_tokens"],
        "compression_rate": summary["compression_rate"],
        "wall_s": round(wall, 1),
        "records_per_s_wall": round(summary["records"] / wall, 3),
        "scoring_s": round(run["scoring_s"], 1),
        "records_per_s_scoring": run["records_per_s"],
        "peak_tree_rss_mib": usage.peak_rss_mib,
        "peak_process_rss_mib": usage.peak_process_rss_mib,
        "mean_load_avg_1m": usage.mean_load_avg_1m,
    }


def run_records(out: Path) -> dict[int, dict[str, Any]]:
    """A `medtpe predict` run's per-record rows (`*.records.pq` under `out`) by record number."""
    tables = [read_records(p) for p in sorted(out.rglob(f"*{RECORDS_SUFFIX}"))]
    return {r["record"]: r for r in pa.concat_tables(tables).to_pylist()}


def agreement(first: Path, second: Path) -> dict[str, Any]:
    """How two runs' records compare: same prediction, answer text and token counts, same
    p(yes) to the last bit, and the largest p(yes) difference."""
    a, b = run_records(first), run_records(second)
    common = [r for r in a if r in b]

    def same(*keys: str) -> int:
        return sum(1 for r in common if all(a[r][k] == b[r][k] for k in keys))

    gaps = [
        abs(a[r]["p_yes"] - b[r]["p_yes"])
        for r in common
        if a[r]["p_yes"] is not None and b[r]["p_yes"] is not None
    ]
    return {
        "records": len(a),
        "in_both": len(common),
        "same_prediction": same("prediction", "error"),
        "same_answer_text": same("answer"),
        "same_token_counts": same("original_tokens", "medtpe_tokens"),
        "same_p_yes_exactly": same("p_yes"),
        "max_abs_p_yes_difference": max(gaps, default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--labels", type=Path, help="required without --several-tasks")
    parser.add_argument("--task", default="icu_mortality")
    parser.add_argument("--max-input-tokens", type=int, default=1024)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--systems", nargs="+", choices=["local", "ray"], default=["local", "ray"])
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=1, help="K copies of the input (see above)")
    parser.add_argument("--work-dir", type=Path, default=None, help="Keep outputs here.")
    parser.add_argument("--out", type=Path, default=None, help="Results JSON.")
    parser.add_argument("--several-tasks", help="a,b,c: the night job asked several tasks")
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_predict_"))
    command = shlex.join(
        [".venv/bin/python", "-m", "tools.benchmarks.bench_predict", *sys.argv[1:]]
    )
    if args.several_tasks:
        compared = several_tasks(args.meds, work, args)
        write_results(args.out, command, {"max_input_tokens": args.max_input_tokens, **compared})
        return
    if args.labels is None:
        parser.error("--labels is required without --several-tasks")
    meds, labels = args.meds, args.labels
    if args.repeat > 1:
        meds, labels = repeated_dataset(labels, args.repeat, work / "dataset")
    results: dict[str, Any] = {
        "max_input_tokens": args.max_input_tokens,
        "repeat": args.repeat,
        "systems": {},
    }
    for system in args.systems:
        out = work / system
        results["systems"][system] = run_system(system, meds, labels, out, args)
        print(system, json.dumps(results["systems"][system], indent=1))
    if len(args.systems) == 2:
        results["agreement"] = agreement(work / args.systems[0], work / args.systems[1])
        print("agreement", results["agreement"])
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
