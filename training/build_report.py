"""Measurements and the report of `medtpe build-artefact`: compression of the held-out records,
agreement of the MedTPE model's answers with the original model's, the printed summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medtpe_core.metrics import agreement as prediction_agreement
from medtpe_core.metrics import compression_rate
from medtpe_core.tasks import get_task
from medtpe_core.tokenizer import MedTPETokenizer

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


def answer_text(
    tokenizer: MedTPETokenizer, ids: Sequence[int], eos_ids: Sequence[int], prefix: str = ""
) -> str:
    """An answer's text: the prompt's answer `prefix`, then the ids up to an end-of-sequence id."""
    kept = []
    for i in ids:
        if i in eos_ids:
            break
        kept.append(i)
    return (prefix + tokenizer.decode(kept)).strip()


def answer_agreement(tasks: Sequence[str], student: Sequence[str], teacher: Sequence[str]) -> dict:
    """Exact-text agreement; prediction agreement where the original's answer parses; format
    compliance of both."""
    student_parsed = [
        get_task(name).parse_answer(text) for name, text in zip(tasks, student, strict=True)
    ]
    teacher_parsed = [
        get_task(name).parse_answer(text) for name, text in zip(tasks, teacher, strict=True)
    ]
    shared = prediction_agreement(
        [prediction for prediction, _ in teacher_parsed],
        [prediction for prediction, _ in student_parsed],
        [prediction is not None for prediction, _ in teacher_parsed],
    )
    n = max(len(tasks), 1)
    return {
        "n": len(tasks),
        "exact_answer_agreement": sum(s == t for s, t in zip(student, teacher, strict=True)) / n,
        "n_original_parsed": sum(prediction is not None for prediction, _ in teacher_parsed),
        "prediction_agreement": shared["agreement_answered"] or 0.0,
        "format_compliance": sum(ok for _, ok in student_parsed) / n,
        "format_compliance_original": sum(ok for _, ok in teacher_parsed) / n,
    }


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
            f"  SSFT {loss}{kept}: held-out pseudo-label loss {run['initial_val_loss']:.4f} -> "
            f"{run['best_val_loss']:.4f} in {run['steps']} steps"
        )
    agreement = report["measure"].get("agreement")
    if agreement:
        lines.append(
            f"  agreement with the original model on {agreement['n']} held-out prompts: "
            f"{agreement['exact_answer_agreement']:.1%} same answer text, "
            f"{agreement['prediction_agreement']:.1%} same prediction"
        )
    lines.append(f"  wall time: {report['seconds']:.0f} s")
    return lines
