"""Measurements and the report of `medtpe build-artefact`: compression of the held-out records
and the printed summary (with the fidelity gate's figures, `medtpe.training.fidelity_gate`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medtpe.core.metrics import compression_rate
from medtpe.core.tokenizer import MedTPETokenizer

REPORT_FILE = "build_report.json"


def compression(tokenizer: MedTPETokenizer, prompts: Sequence[str], records: Sequence[str]) -> dict:
    """Token counts of the held-out prompts and of their records under both tokenizers."""
    result: dict[str, Any] = {"n_records": len(prompts)}
    for name, texts, special in (("prompt", prompts, True), ("record", records, False)):
        base = sum(len(tokenizer.base_encode(t, special_tokens=special)) for t in texts)
        medtpe = sum(len(tokenizer.encode(t, special_tokens=special)) for t in texts)
        result |= {
            f"{name}_tokens_original": base,
            f"{name}_tokens_medtpe": medtpe,
            f"{name}_compression_rate": compression_rate(base, medtpe),
        }
    return result


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The human summary of a build report."""
    mined, base = report["mine"], report["base"]
    held = report["measure"]["compression"]
    tied = "tied" if base["tied_embeddings"] else "untied"
    lines = [
        f"MedTPE artefact {report['artefact_id']} -> {report['out']}",
        f"  base: {base['model_dir']} ({base['model_type']}, vocabulary "
        f"{base['vocab_size']:,}, {tied} embeddings)",
        f"  mined: {mined['n_new_tokens']} new tokens from {mined['n_records']} records, "
        f"{mined['n_tokens']:,} tokens",
        f"  held-out compression: {held['prompt_compression_rate']:.1%} of the prompt tokens, "
        f"{held['record_compression_rate']:.1%} of the record tokens ({held['n_records']} records)",
    ]
    for loss, run in report["ssft"].items():
        kept = " (kept)" if loss == report["pick"]["loss"] else ""
        lines.append(
            f"  SSFT {loss}{kept}: held-out {loss} loss {run['initial_val_loss']:.4f} -> "
            f"{run['best_val_loss']:.4f} in {run['steps']} steps"
        )
    for budget, result in report["gate"].items():
        figures = result["fidelity"]
        delta, same = figures["delta_p_mean"]["value"], figures["same_answer"]["value"]
        lines.append(
            f"  fidelity gate at {budget} tokens ({figures['n_records']} held-out windows"
            + (f", {result['dtype']}" if "dtype" in result else "")  # not in older reports
            + "): "
            + ("no answer from either model" if same is None else f"same answer {same:.1%}")
            + ", mean |Δp| "
            + ("-" if delta is None else f"{delta:.4f}")
            + f", same stop {figures['same_stop']:.1%}: "
            + ("; ".join(result["failures"]) or "passed")
        )
    lines.append(f"  wall time: {report['seconds']:.0f} s")
    return lines
