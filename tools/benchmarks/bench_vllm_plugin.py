"""Stock `vllm serve` with the MedTPE tokenizer plugin against stock `vllm serve` of the base
checkpoint, measured with vLLM's own load generator (`vllm bench serve`, run in-process).

Prompts: ICU-mortality prompts rendered from a MEDS dataset as `medtpe render` renders them
(chat template applied, the record's newest events within the budget in original tokens) at each
budget, the first `--records` label rows whose prompt fills at least 90 % of the budget. Both
servers get the same text (`--dataset-name custom --skip-chat-template`) and the same engine
settings (eager, prefix caching off so every request pays its prefill, `--max-num-seqs`, seed),
one request at a time, a fixed number of answer tokens (`--ignore-eos`), greedy. Reported per
budget and side: TTFT p50/p99, request throughput, prompt tokens per request (the server's own
`/tokenize` count, checked against the count vLLM's client made with the same tokenizer), the
answers parsed under the task on every record. Also the tokenizer's own cost per prompt at the
largest budget: the plugin's MedTPE tokenizer against the base model's stock tokenizer, as vLLM
calls them (`tokenizer(text)`), median of `--repeats` calls.

    .venv/bin/python -m tools.benchmarks.bench_vllm_plugin --records 4 \
        --out tools/benchmarks/results/vllm_plugin.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe.core.prompt import ChatTemplate, build_prompt
from medtpe.core.tasks import Task, get_task
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.training.default_model import ensure_base_model
from medtpe.training.export import ensure_export
from tools.benchmarks.results_file import write_results

DEFAULT_MEDS = Path(__file__).resolve().parents[3] / "shared/data/mimic-iv-demo-meds"
FILL = 0.9
"""A prompt counts for a budget when it fills at least this share of it."""


def render_prompts(
    meds: Path, labels: Path, task: Task, model_dir: Path, budget: int, n: int
) -> list[dict[str, Any]]:
    """The first `n` label rows' prompts that fill the budget (text, original token count)."""
    dataset = MedsDataset.load(meds)
    base = BaseTokenizer.load(model_dir)
    template = ChatTemplate.from_model_dir(model_dir)
    known = set(dataset.subject_ids)
    out: list[dict[str, Any]] = []
    rows = [row for row in read_labels(labels) if row.subject_id in known]
    for row in tqdm(rows, desc=f"render {budget}", unit="record"):
        prompt = build_prompt(
            task,
            dataset.events(row.subject_id),
            row.prediction_time,
            base,
            template,
            budget,
            dataset.descriptions,
        )
        if prompt.n_tokens_original >= FILL * budget:
            item = {"subject_id": row.subject_id, "prompt": prompt.text}
            item["prediction_time"] = row.prediction_time.isoformat()
            out.append(item | {"n_tokens_original": prompt.n_tokens_original})
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} records fill {FILL:.0%} of {budget} tokens")


def start_server(
    model_dir: Path,
    args: argparse.Namespace,
    log: Path,
    flags: Sequence[str] = ("--enforce-eager", "--no-enable-prefix-caching"),
) -> tuple[Any, int]:
    """vLLM's OpenAI server (what `vllm serve` runs; the CPU build's `vllm` script fails) on a
    free port, once `/health` answers; `flags`: its engine settings beyond the context, batch
    and seed (by default eager, prefix caching off)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    command += ["--model", str(model_dir), "--served-model-name", "model"]
    command += ["--max-model-len", str(args.max_model_len), *flags]
    command += ["--max-num-seqs", str(args.max_num_seqs)]
    command += ["--seed", "0", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    while process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process, port
        time.sleep(2)
    raise SystemExit(f"vLLM exited with {process.returncode}, see {log}")


def bench_serve(model_dir: Path, port: int, dataset: Path, n: int, args: argparse.Namespace) -> Any:
    """`vllm bench serve` with the custom dataset, in this process; its result dictionary."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.plugins import load_general_plugins
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    load_general_plugins()  # the client counts prompt tokens with the server's tokenizer

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", f"http://127.0.0.1:{port}"]
    argv += ["--model", str(model_dir), "--served-model-name", "model"]
    argv += ["--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template"]
    argv += ["--disable-shuffle", "--num-prompts", str(n)]
    argv += ["--custom-output-len", str(args.output_len), "--ignore-eos", "--temperature", "0"]
    argv += ["--max-concurrency", "1", "--request-rate", "inf", "--save-detailed"]
    argv += ["--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99"]
    return main(parser.parse_args(argv))


def server_counts(port: int, prompts: list[dict[str, Any]]) -> list[int]:
    """Prompt tokens of each prompt as the server counts them (`/tokenize`)."""
    url = f"http://127.0.0.1:{port}/tokenize"
    body = [{"model": "model", "prompt": p["prompt"]} for p in prompts]
    return [httpx.post(url, json=b, timeout=120).json()["count"] for b in body]


def run_side(
    name: str, model_dir: Path, datasets: dict[int, tuple[Path, list[dict[str, Any]]]], args: Any
) -> dict[int, dict[str, Any]]:
    """One server for every budget; per budget the bench figures and the answers."""
    log = args.logs / f"vllm_{name}.log"
    process, port = start_server(model_dir, args, log)
    task = get_task(args.task)
    out: dict[int, dict[str, Any]] = {}
    try:
        for budget, (path, prompts) in datasets.items():
            counts = server_counts(port, prompts)
            result = bench_serve(model_dir, port, path, len(prompts), args)
            if result["completed"] != len(prompts):
                raise SystemExit(f"{name} {budget}: {result['failed']} requests failed, see {log}")
            if sorted(result["input_lens"]) != sorted(counts):
                raise SystemExit(f"{name} {budget}: client and server token counts differ")
            answers = [
                task.parse_answer(task.response_prefix + t) for t in result["generated_texts"]
            ]
            out[budget] = {
                "ttft_p50_ms": result["p50_ttft_ms"],
                "ttft_p99_ms": result["p99_ttft_ms"],
                "e2el_p50_ms": result["p50_e2el_ms"],
                "request_throughput_per_s": result["request_throughput"],
                "prompt_tokens_per_request": statistics.mean(counts),
                "prompt_tokens": counts,
                "answers": [a.prediction for a in answers],
                "format_ok": sum(a.format_ok for a in answers),
                "generated_texts": result["generated_texts"],
            }
    finally:
        process.terminate()
        process.wait(120)
    return out


def tokenization_cost(base_dir: Path, export_dir: Path, prompts: list[str], repeats: int) -> Any:
    """Ms of `tokenizer(text)` per prompt, the base's stock tokenizer and the plugin's called in
    turn (both see the same machine load): medians, and the median of the paired differences."""
    from vllm.plugins import load_general_plugins
    from vllm.tokenizers.registry import get_tokenizer

    load_general_plugins()
    stock, plugin = get_tokenizer(str(base_dir)), get_tokenizer(str(export_dir))
    times: dict[str, list[float]] = {"stock": [], "medtpe_plugin": []}
    for text in prompts:
        stock(text), plugin(text)  # warm
        for _ in range(repeats):
            for name, tokenizer in (("stock", stock), ("medtpe_plugin", plugin)):
                start = time.perf_counter()
                tokenizer(text)
                times[name].append((time.perf_counter() - start) * 1000)
    pairs = zip(times["medtpe_plugin"], times["stock"], strict=True)
    return {
        "calls_per_side": len(times["stock"]),
        "stock_median_ms": statistics.median(times["stock"]),
        "medtpe_plugin_median_ms": statistics.median(times["medtpe_plugin"]),
        "extra_median_ms": statistics.median(a - b for a, b in pairs),
        "types": [type(stock).__name__, type(plugin).__name__],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, default=DEFAULT_MEDS)
    parser.add_argument("--labels", type=Path, default=None, help="default: MEDS/labels/TASK")
    parser.add_argument("--task", default="icu_mortality")
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--records", type=int, default=4, help="prompts per budget")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20, help="tokenizer calls per prompt")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/bench_vllm_plugin"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    labels = args.labels or args.meds / "labels" / f"{args.task}.parquet"

    base_dir = ensure_base_model(default_model_dir())
    export_dir = ensure_export(base_dir, default_artefact_dir(), default_export_dir())
    context = json.loads((base_dir / "config.json").read_text())["max_position_embeddings"]
    args.max_model_len = context
    task = get_task(args.task)
    datasets = {}
    for budget in args.budgets:
        fitted = min(budget, context - args.output_len)  # the answer must fit the context
        prompts = render_prompts(args.meds, labels, task, base_dir, fitted, args.records)
        path = args.logs / f"prompts_{budget}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"prompt": p["prompt"]}) + "\n" for p in prompts))
        datasets[budget] = (path, prompts)

    sides = {
        "stock": run_side("stock", base_dir, datasets, args),
        "medtpe_plugin": run_side("medtpe_plugin", export_dir, datasets, args),
    }
    largest = max(args.budgets)
    results: dict[str, Any] = {"records_per_budget": args.records, "budgets": {}}
    for budget, (_, prompts) in datasets.items():
        stock, medtpe = sides["stock"][budget], sides["medtpe_plugin"][budget]
        results["budgets"][str(budget)] = {
            "subject_ids": [p["subject_id"] for p in prompts],
            "prediction_times": [p["prediction_time"] for p in prompts],
            "n_tokens_original": [p["n_tokens_original"] for p in prompts],
            "stock": stock,
            "medtpe_plugin": medtpe,
            "ttft_p50_ratio": medtpe["ttft_p50_ms"] / stock["ttft_p50_ms"],
            "throughput_ratio": medtpe["request_throughput_per_s"]
            / stock["request_throughput_per_s"],
            "prompt_token_ratio": medtpe["prompt_tokens_per_request"]
            / stock["prompt_tokens_per_request"],
            "same_answer": sum(
                a == b for a, b in zip(stock["answers"], medtpe["answers"], strict=True)
            ),
        }
    texts = [p["prompt"] for p in datasets[largest][1]]
    results["tokenization_per_prompt"] = {
        "budget": largest,
        **tokenization_cost(base_dir, export_dir, texts, args.repeats),
    }
    command = "python -m tools.benchmarks.bench_vllm_plugin " + subprocess.list2cmdline(
        sys.argv[1:]
    )
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
