"""CUDA figures against this CPU: SSFT optimizer steps at the serving budget, and prefill time on
the original and the MedTPE ids of the same rendered records (random weights, model shapes only).

Three steps. `ids` runs where the data and tokenizers are (this machine) and writes a small bundle
(token ids, the default model's config, its MedTPE tokenizer); `ssft` and `prefill` read only the
bundle, so they run on a GPU host that has torch and transformers:

    python -m tools.research.bench_cuda ids --smollm2-train T.jsonl --smollm2-held-out A.jsonl ...
    \\
        --qwen-held-out B.jsonl ... --qwen-medtpe DIR --out .gpu
    python -m tools.research.bench_cuda ssft --bundle .gpu --device cuda --out ssft_cuda.json
    python -m tools.research.bench_cuda prefill --bundle .gpu --out prefill_cuda.json

`ssft` times the trainer's own optimizer step (`medtpe.training.ssft`: the embedding split, bf16
frozen weights on CUDA, float32 on the CPU, the default build's batch 1 x accumulation 4) on windows
of the serving budget. `prefill` times one forward pass of a Hugging Face model (SDPA attention, no
KV cache, logits of the last position only) per record and side, the two sides of a record one
after the other, median of `--repeats` after a warm-up: a proxy for an engine's prefill, not vLLM.
Random weights make the answers meaningless: fidelity figures come from `medtpe evaluate`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medtpe.training.loss_names import LOSSES
from tools.benchmarks.results_file import write_results

if TYPE_CHECKING:
    from medtpe.core.tokenizer import MedTPETokenizer

RECORDS_FILE = "records.json"
EXAMPLES_FILE = "ssft_examples.jsonl"
SMOLLM2_TOKENIZER_DIR = "smollm2-medtpe"
SMOLLM2_CONFIG_DIR = "smollm2-config"
SIDES = ("original", "medtpe")
ANSWER_TEXT = 'yes"}'
"""The answer after the prompt's prefilled `{"answer": "`: what the default model writes."""

CAUSAL_SDPA = "medtpe_causal_sdpa"
CAUSAL = {"is_causal": True}
QWEN25_15B = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
"""Qwen2.5-1.5B-Instruct's shapes (its published config.json)."""


def _side_by_side(tokenizer: MedTPETokenizer, path: Path) -> list[dict[str, Any]]:
    """Original and MedTPE ids of each rendered prompt of `path` (`medtpe render` output)."""
    from medtpe.training.ssft_pipeline import read_records

    rows = []
    for record in read_records(path):
        original = tokenizer.base_encode(record["prompt"], special_tokens=True)
        ids = dict(zip(SIDES, (original, tokenizer.encode_ids(original)), strict=True))
        rows.append({k: record[k] for k in ("subject_id", "prediction_time")} | ids)
    return rows


def write_bundle(args: argparse.Namespace) -> None:
    """The `ids` step: token ids of the rendered records, SSFT examples, config, tokenizer."""
    from medtpe.core.tokenizer import MedTPETokenizer
    from medtpe.training.examples import Example, save_examples

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    smollm2 = MedTPETokenizer.load(args.smollm2_medtpe)
    qwen = MedTPETokenizer.load(args.qwen_medtpe)
    records = {
        "smollm2-135m": {
            str(budget): _side_by_side(smollm2, path)
            for budget, path in zip(args.budgets, args.smollm2_held_out, strict=True)
        },
        "qwen2.5-1.5b": {
            str(budget): _side_by_side(qwen, path)
            for budget, path in zip(args.budgets, args.qwen_held_out, strict=True)
        },
    }
    (out / RECORDS_FILE).write_text(json.dumps(records))
    answer = smollm2.base_encode(ANSWER_TEXT)
    windows = _side_by_side(smollm2, args.smollm2_train)[: args.n_windows]
    save_examples(
        out / EXAMPLES_FILE, [Example(w["medtpe"], w["original"], answer) for w in windows]
    )
    shutil.copytree(args.smollm2_medtpe, out / SMOLLM2_TOKENIZER_DIR, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.csv", ".build"))  # fmt: skip
    (out / SMOLLM2_CONFIG_DIR).mkdir(exist_ok=True)
    shutil.copy(args.smollm2_config / "config.json", out / SMOLLM2_CONFIG_DIR / "config.json")
    print(f"wrote {out}: {sum(len(v) for m in records.values() for v in m.values())} records, "
          f"{len(windows)} SSFT windows")  # fmt: skip


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _write(path: Path, results: dict[str, Any]) -> None:
    write_results(path, " ".join(["python -m tools.research.bench_cuda", *sys.argv[1:]]), results)


def _host() -> dict[str, Any]:
    import torch

    host: dict[str, Any] = {"torch": torch.__version__}
    if torch.cuda.is_available():
        host["gpu"] = torch.cuda.get_device_name(0)
    host["cpu_threads"] = torch.get_num_threads()
    return host


def time_ssft(args: argparse.Namespace) -> None:
    """The `ssft` step: seconds per optimizer step of each loss at the serving budget."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from medtpe.core.tokenizer import MedTPETokenizer
    from medtpe.training.examples import load_examples
    from medtpe.training.ssft import SSFTConfig, optimizer_step, start_run, weights_dtype

    bundle: Path = args.bundle
    tokenizer = MedTPETokenizer.load(bundle / SMOLLM2_TOKENIZER_DIR)
    examples = load_examples(bundle / EXAMPLES_FILE)
    config = AutoConfig.from_pretrained(bundle / SMOLLM2_CONFIG_DIR)
    results: dict[str, Any] = {"host": _host(), "windows": len(examples), "losses": {}}
    results["window_tokens"] = {
        side: [len(getattr(e, field)) for e in examples]
        for side, field in zip(SIDES, ("teacher", "student"), strict=True)
    }
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        for loss in args.losses:
            ssft = SSFTConfig(loss=loss, lr=2e-4, batch_size=1, grad_accum=args.grad_accum,
                              device=args.device)  # fmt: skip
            run = start_run(Path(tmp), tokenizer, len(examples), Path(tmp) / loss, ssft)
            run.model.train()
            step = [[e] for e in examples[: args.grad_accum]]
            seconds = []
            for i in range(args.warmup + args.steps):
                _synchronize(run.device)
                started = time.perf_counter()
                optimizer_step(run, step)
                _synchronize(run.device)
                if i >= args.warmup:
                    seconds.append(time.perf_counter() - started)
            peak = (
                torch.cuda.max_memory_allocated(run.device) / 2**30
                if run.device.type == "cuda" else None
            )  # fmt: skip
            results["losses"][loss] = {
                "device": str(run.device),
                "weights_dtype": str(weights_dtype(run.device)),
                "step_seconds": seconds,
                "median_step_seconds": statistics.median(seconds),
                "steps_per_second": 1 / statistics.median(seconds),
                "peak_gpu_gib": peak,
            }
            print(f"ssft {loss} on {run.device}: {statistics.median(seconds):.3f} s/step "
                  f"({args.grad_accum} windows of {len(examples[0].teacher)} tokens)")  # fmt: skip
            del run
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    _write(args.out, results)


def _cuda_timer(fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of `fn` over `repeats` runs after one warm-up (CUDA events)."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def register_causal_sdpa() -> str:
    """Register SDPA with `is_causal=True` and no mask tensor under `CAUSAL_SDPA`: what
    transformers' "sdpa" runs eagerly, also inside a CUDA-graph capture (where "sdpa" builds a
    full mask and leaves the flash kernel). Returns the name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any) -> Any:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs | CAUSAL)

    AttentionInterface.register(CAUSAL_SDPA, attention)
    AttentionMaskInterface.register(CAUSAL_SDPA, lambda *args, **kwargs: None)
    return CAUSAL_SDPA


def _prefill_model(name: str, bundle: Path) -> Any:
    """A randomly initialised bf16 model of `name`'s shapes on the GPU (causal SDPA)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    if name == "qwen2.5-1.5b":
        config = Qwen2Config(**QWEN25_15B)
    else:
        config = AutoConfig.from_pretrained(bundle / SMOLLM2_CONFIG_DIR)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.bfloat16, attn_implementation=register_causal_sdpa()
    )
    return model.to("cuda").eval()


def _graph_replay(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured in a CUDA graph (after a warm-up on a side stream): a callable that
    replays it and returns its (static) output."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> Any:
        graph.replay()
        return out

    return replay


def _prefill_rows(model: Any, records: Sequence[dict[str, Any]], repeats: int) -> list[dict]:
    """Per record and side: eager milliseconds (kernel launches included), CUDA-graph replay
    milliseconds (the GPU's own time, as an engine that captures graphs sees it), and the largest
    difference between the two runs' last-position logits."""
    import torch

    def forward(ids: torch.Tensor) -> Callable[[], Any]:
        return lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    rows = []
    with torch.inference_mode():
        for record in records:
            row: dict[str, Any] = {"subject_id": record["subject_id"]}
            for side in SIDES:
                ids = torch.tensor([record[side]], device="cuda")
                eager, graphed = forward(ids), _graph_replay(forward(ids))
                row[f"{side}_tokens"] = len(record[side])
                row[f"{side}_ms"] = _cuda_timer(eager, repeats)
                row[f"{side}_graph_ms"] = _cuda_timer(graphed, repeats)
                row[f"{side}_graph_max_abs_diff"] = (eager() - graphed()).abs().max().item()
            rows.append(row)
    return rows


def _prefill_summary(rows: Sequence[dict[str, Any]], timing: str) -> dict[str, Any]:
    """Means and the MedTPE / original ratio of one timing (`ms` or `graph_ms`)."""
    original = sum(r[f"original_{timing}"] for r in rows)
    medtpe = sum(r[f"medtpe_{timing}"] for r in rows)
    ratios = [r[f"medtpe_{timing}"] / r[f"original_{timing}"] for r in rows]
    tokens = sum(r["original_tokens"] for r in rows), sum(r["medtpe_tokens"] for r in rows)
    return {
        "records": len(rows),
        "original_tokens_mean": tokens[0] / len(rows),
        "medtpe_tokens_mean": tokens[1] / len(rows),
        "token_ratio": tokens[1] / tokens[0],
        "original_ms_mean": original / len(rows),
        "medtpe_ms_mean": medtpe / len(rows),
        "time_ratio": medtpe / original,
        "time_ratio_per_record_min": min(ratios),
        "time_ratio_per_record_max": max(ratios),
    }


def time_prefill(args: argparse.Namespace) -> None:
    """The `prefill` step: per-record prefill ms of both sides, each model and budget."""
    import torch

    records = json.loads((args.bundle / RECORDS_FILE).read_text())
    results: dict[str, Any] = {"host": _host(), "repeats": args.repeats, "models": {}}
    for name, budgets in records.items():
        model = _prefill_model(name, args.bundle)
        results["models"][name] = {}
        for budget, rows in budgets.items():
            timed = _prefill_rows(model, rows, args.repeats)
            summaries = {t: _prefill_summary(timed, t) for t in ("ms", "graph_ms")}
            results["models"][name][budget] = {"summary": summaries, "records": timed}
            for timing, s in summaries.items():
                print(f"prefill {name} @ {budget} ({timing}): original {s['original_ms_mean']:.2f}"
                      f" ms ({s['original_tokens_mean']:.0f} tok), MedTPE {s['medtpe_ms_mean']:.2f}"
                      f" ms ({s['medtpe_tokens_mean']:.0f} tok): time x{s['time_ratio']:.3f}, "
                      f"tokens x{s['token_ratio']:.3f}")  # fmt: skip
        del model
        torch.cuda.empty_cache()
    _write(args.out, results)


def random_checkpoint(shape: dict[str, Any], tokenizer_dir: Path, out: Path) -> Path:
    """A bfloat16 checkpoint of `shape` (a Qwen2 config) with seeded random weights and the
    tokenizer files of `tokenizer_dir` (tokenizer.json, tokenizer_config.json with its chat
    template): a base model a build can run on where only time matters."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=torch.bfloat16)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def time_distill(args: argparse.Namespace) -> None:
    """The `distill` step: a build (`--config`) up to and including its token distillation, on
    a Qwen2.5-1.5B-shaped model with random weights (`--tokenizer`) or on a real model
    (`--base`); seconds of each step, the distillation's own record (teacher and training
    seconds per stage, losses); with `--rows-out`, the distilled rows (an artefact directory
    `bench_fidelity diagnose` reads). `--float32` keeps the frozen weights in float32 on CUDA
    (a CUDA build loads them in bfloat16): the arithmetic of a CPU build. `--build-dir` builds
    there instead of in a temporary directory, its work directory (`<dir>/.build`) kept: what
    `bench_distill_answer_windows --work` reads, and a second run resumes it."""
    import torch

    import medtpe.training.ssft as ssft
    from medtpe.training.build_artefact import ArtefactBuild
    from medtpe.training.build_config import build_config

    if args.float32:
        ssft.weights_dtype = lambda device: torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        if args.base is not None:
            base, model = args.base, str(args.base)
        else:
            base = random_checkpoint(QWEN25_15B, args.tokenizer, Path(tmp) / "base")
            model = "qwen2.5-1.5b (random weights)"
        out = args.build_dir or Path(tmp) / "out"
        overrides = {"base": base, "meds": args.meds, "out": out}
        build = ArtefactBuild(build_config(args.config, overrides | {"device": args.device}))
        for name, step in build.steps():
            started = time.perf_counter()
            build.state.finish(name, step(), time.perf_counter() - started)
            print(f"{name}: {build.state.steps[name]['seconds']} s")
            if name == "distill":
                break
        if args.rows_out is not None:
            shutil.copytree(build.work / "artefact-distill", args.rows_out, dirs_exist_ok=True)
        results = {"host": _host(), "model": model, "float32": args.float32}
        _write(args.out, results | {"config": str(args.config), "steps": build.state.steps})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    ids = steps.add_parser("ids", help="write the bundle (needs the data and tokenizers)")
    ids.add_argument("--smollm2-medtpe", type=Path, default=Path("artefacts/smollm2-135m-icu"))
    ids.add_argument("--smollm2-config", type=Path,
                     default=Path(".cache/models/smollm2-135m-instruct"))  # fmt: skip
    ids.add_argument("--smollm2-train", type=Path, required=True, help="`medtpe render` JSONL")
    ids.add_argument("--smollm2-held-out", type=Path, nargs="+", required=True)
    ids.add_argument("--qwen-medtpe", type=Path, required=True, help="Qwen2.5 MedTPE artefact")
    ids.add_argument("--qwen-held-out", type=Path, nargs="+", required=True)
    ids.add_argument("--budgets", type=int, nargs="+", default=[8192, 4096],
                     help="the budget of each --*-held-out file, same order")  # fmt: skip
    ids.add_argument("--n-windows", type=int, default=8)
    ids.add_argument("--out", type=Path, required=True)
    ids.set_defaults(fn=write_bundle)
    ssft = steps.add_parser("ssft", help="time SSFT optimizer steps")
    ssft.add_argument("--bundle", type=Path, required=True)
    ssft.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    ssft.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES))
    ssft.add_argument("--grad-accum", type=int, default=4)
    ssft.add_argument("--warmup", type=int, default=2)
    ssft.add_argument("--steps", type=int, default=5)
    ssft.add_argument("--out", type=Path, required=True)
    ssft.set_defaults(fn=time_ssft)
    prefill = steps.add_parser("prefill", help="time prefill on a CUDA GPU")
    prefill.add_argument("--bundle", type=Path, required=True)
    prefill.add_argument("--repeats", type=int, default=5)
    prefill.add_argument("--out", type=Path, required=True)
    prefill.set_defaults(fn=time_prefill)
    distill = steps.add_parser("distill", help="a build up to its token distillation, timed")
    distill.add_argument("--config", type=Path, required=True, help="build settings (YAML)")
    model = distill.add_mutually_exclusive_group(required=True)
    model.add_argument("--tokenizer", type=Path, help="Qwen2.5 tokenizer dir (random 1.5B)")
    model.add_argument("--base", type=Path, help="a real base model dir")
    distill.add_argument("--float32", action="store_true", help="frozen weights in float32")
    distill.add_argument("--rows-out", type=Path, help="copy the distilled rows here")
    distill.add_argument("--build-dir", type=Path, help="build here, its work dir kept")
    distill.add_argument("--meds", type=Path, default=Path("../shared/data/mimic-iv-demo-meds"))
    distill.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    distill.add_argument("--out", type=Path, required=True)
    distill.set_defaults(fn=time_distill)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
