"""Response bodies from the inference layer's results: one builder per response type."""

from __future__ import annotations

from collections.abc import Sequence

from medtpe.core.fhir import FhirRecord
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import PreparedRecord, RecordAnswer, Segmentation
from medtpe.service.predict.schemas import (
    FhirMapping,
    FhirWarning,
    Latency,
    PredictOptions,
    PredictResponse,
    PredictTasksResponse,
    ResourceMapping,
    SharedTokens,
    TaskPrediction,
    TokenCounts,
    Vote,
)
from medtpe.service.predict.tokenize_schemas import (
    MergedToken,
    PromptTokens,
    TaskTokens,
    TokenizeResponse,
    TokenizeTasksResponse,
    TokenList,
    TokenSpan,
)


def predict_response(
    model: LoadedModel, answered: RecordAnswer, options: PredictOptions
) -> PredictResponse:
    """The answer to one record with its token counts, latency breakdown, model identity and,
    for a FHIR record, the mapping's counts."""
    record, answer = answered.record, answered.answer
    seg = record.segmentation
    return PredictResponse(
        task=record.task.name,
        prediction=answer.prediction,
        format_ok=answer.format_ok,
        votes=[
            Vote(
                prediction=s.prediction,
                format_ok=s.format_ok,
                text=s.text if options.return_text else None,
                trailing=s.trailing if options.return_text else None,
            )
            for s in answer.samples
        ],
        probabilities=answer.probabilities,
        prediction_time=record.prediction_time,
        events=_event_counts(record),
        tokens=TokenCounts(
            original=len(seg.original_ids),
            medtpe=len(seg.medtpe_ids),
            compression_rate=seg.compression_rate,
            generated=answer.n_generated,
        ),
        latency_ms=Latency(
            render=record.render_s * 1e3,
            tokenize=record.tokenize_s * 1e3,
            generate=answer.generate_s * 1e3,
            total=answered.total_s * 1e3,
        ),
        model=model.identity,
        fhir=fhir_mapping(record.fhir) if record.fhir is not None else None,
    )


def tasks_response(
    responses: Sequence[PredictResponse], answered: Sequence[RecordAnswer]
) -> PredictTasksResponse:
    """The answer to several tasks about one record: each task's response (`predict_response`,
    with its row's id and receipt) with its prefix-cache hit, the record's digest (its
    receipts') and the tokens their prompts share."""
    seg = answered[0].record.segmentation
    receipt = responses[0].receipt
    return PredictTasksResponse(
        record_sha256=receipt.receipt["record_sha256"] if receipt is not None else None,
        shared_tokens=SharedTokens(original=seg.n_shared_original, medtpe=seg.n_shared_medtpe),
        results=[
            TaskPrediction(**dict(response), cached_tokens=a.answer.cached_tokens)
            for response, a in zip(responses, answered, strict=True)
        ],
    )


def fhir_mapping(record: FhirRecord) -> FhirMapping:
    """The response's account of a FHIR record's mapping: subject id and per-type counts."""
    counts = record.counts.as_dict()
    return FhirMapping(
        subject_id=record.subject_id,
        counts={name: ResourceMapping(**values) for name, values in counts.items()},
        warnings=[FhirWarning(loc=list(w.loc), msg=w.text) for w in record.warnings],
    )


def _event_counts(record: PreparedRecord) -> dict[str, int]:
    return {"total": record.prompt.n_events_total, "kept": record.prompt.n_events_kept}


def token_span(tokenizer: MedTPETokenizer, seg: Segmentation) -> TokenSpan:
    """Both segmentations, ids with their readable token strings, each MedTPE token's pair."""
    return TokenSpan(
        original=TokenList(
            ids=seg.original_ids,
            tokens=tokenizer.base.tokens(seg.original_ids),
            count=len(seg.original_ids),
        ),
        medtpe=TokenList(
            ids=seg.medtpe_ids,
            tokens=tokenizer.tokens(seg.medtpe_ids),
            count=len(seg.medtpe_ids),
        ),
        compression_rate=seg.compression_rate,
        merged=merged_tokens(tokenizer, seg.medtpe_ids),
    )


def tokenize_response(
    tokenizer: MedTPETokenizer, seg: Segmentation, record: PreparedRecord | None = None
) -> TokenizeResponse:
    """Both segmentations (`token_span`); for a `record`, its event counts and input budget."""
    return TokenizeResponse(
        **dict(token_span(tokenizer, seg)),
        events=_event_counts(record) if record is not None else None,
        max_input_tokens=record.max_input_tokens if record is not None else None,
    )


def tokenize_tasks_response(
    tokenizer: MedTPETokenizer, prepared: Sequence[PreparedRecord]
) -> TokenizeTasksResponse:
    """Several tasks' prompts about one record (`Predictor.prepare_all`): the leading ids they
    share once, then each task's tail past them, its whole prompt's counts and its events."""
    seg = prepared[0].segmentation
    n_original, n_medtpe = seg.n_shared_original, seg.n_shared_medtpe
    shared = Segmentation(seg.original_ids[:n_original], seg.medtpe_ids[:n_medtpe])
    results = []
    for record in prepared:
        whole = record.segmentation
        tail = Segmentation(whole.original_ids[n_original:], whole.medtpe_ids[n_medtpe:])
        total = PromptTokens(
            original=len(whole.original_ids),
            medtpe=len(whole.medtpe_ids),
            compression_rate=whole.compression_rate,
        )
        results.append(
            TaskTokens(
                task=record.task.name,
                tail=token_span(tokenizer, tail),
                total=total,
                events=_event_counts(record),
            )
        )
    return TokenizeTasksResponse(
        shared=token_span(tokenizer, shared),
        results=results,
        max_input_tokens=prepared[0].max_input_tokens,
    )


def merged_tokens(tokenizer: MedTPETokenizer, ids: list[int]) -> list[MergedToken]:
    """Each TPE token among `ids` once (first appearance first), with the pair it merges, the
    base ids it spells and the evicted base token whose id it took."""
    merged = []
    for token_id in dict.fromkeys(ids):
        pair = tokenizer.pair_of(token_id)
        if pair is None:
            continue
        evicted = token_id < tokenizer.base.vocab_size
        merged.append(
            MergedToken(
                id=token_id,
                pair=pair,
                pair_tokens=tuple(tokenizer.tokens(pair)),
                base_ids=tokenizer.to_base_ids([token_id]),
                reuses=tokenizer.base.tokens([token_id])[0] if evicted else None,
            )
        )
    return merged
