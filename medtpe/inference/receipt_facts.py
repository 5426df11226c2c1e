"""What every door records of one answer in the prediction ledger (`AnswerFacts`): the record
read (events, prediction time, a FHIR record's descriptions), the prompt's ids, the artefact's
digest, the rendering settings, the model, the decoding settings, the versions, the answer and
the response's figures. `medtpe.ledger.answers.ReceiptBasis.of` hashes them into a receipt basis,
which `medtpe.ledger.answers.ReceiptBasis.signed` signs into a row. The dtype is the one the
engine ran in (`Engine.dtype`), never the option's `auto`.

`/predict`, `/predict/batch`, the CDS hooks, the fidelity shadow, `medtpe predict` and
`medtpe verify`'s re-derivation take their facts from `answer_facts` only, so a row says the same
things whichever door wrote it."""

from __future__ import annotations

import importlib.metadata
from functools import cache
from pathlib import Path

from medtpe.core.answer_facts import AnswerFacts, RenderingFacts
from medtpe.core.tokenizer.artefact_manifest import content_digest
from medtpe.inference.engines.protocol import Engine
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Answer, PreparedRecord
from medtpe.inference.sampling import Sampling


def answer_facts(
    model: LoadedModel,
    engine: Engine,
    prepared: PreparedRecord,
    sampling: Sampling,
    answer: Answer,
    latency_s: float,
) -> AnswerFacts:
    """The facts of `answer` to `prepared` by `model` on `engine`, `latency_s` after the
    record's work began."""
    predictor = model.predictor
    fhir = prepared.fhir
    seg = prepared.segmentation
    return AnswerFacts(
        task=prepared.task.name,
        subject_id=fhir.patient_id
        if fhir is not None and fhir.patient_id
        else str(prepared.events.subject_id),
        events=prepared.events,
        prediction_time=prepared.prediction_time,
        descriptions=fhir.descriptions if fhir is not None else None,
        prompt_ids=prepared.ids(model.identity.mode),
        artefact_digest=artefact_digest(Path(model.bundle.path)),
        rendering=RenderingFacts(
            render_version=model.rendering.render_version,
            descriptions_sha256=model.rendering.digest,
            max_input_tokens=prepared.max_input_tokens,
            window_policy=predictor.windowing.policy.value,
            window_grid_hours=predictor.windowing.grid_hours,
            prompt_layout=predictor.layout.value,
            shell_tokens=prepared.prompt.shell_tokens,
        ),
        model=model.identity.name,
        mode=model.identity.mode,
        dtype=engine.dtype,
        decoding=sampling.as_dict(),
        engine_version=engine_version(engine),
        product_version=product_version(),
        answer=answer.prediction,
        p_yes=(answer.probabilities or {}).get("yes"),
        format_ok=answer.format_ok,
        original_tokens=len(seg.original_ids),
        medtpe_tokens=len(seg.medtpe_ids),
        compression_rate=float(seg.compression_rate),
        latency_ms=latency_s * 1e3,
    )


@cache
def artefact_digest(path: Path) -> str:
    """The artefact's content digest (`load_model` checked it against its manifest; computed
    once per artefact and process)."""
    return content_digest(path)


@cache
def product_version() -> str:
    """The installed MedTPE's version."""
    return importlib.metadata.version("medtpe")


def engine_version(engine: Engine) -> str:
    """The engine implementation and the installed vLLM's version (`InstantEngine/vllm-0.11.0`)."""
    return f"{type(engine).__name__}/vllm-{_vllm_version()}"


@cache
def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "none"
