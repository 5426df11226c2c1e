"""The record objects every door prepares (`medtpe.inference.record`), the mode-free prepared record
(`PreparedRecord.ids`) and the one decoding type (`medtpe.inference.sampling.Sampling`) as
`Predictor.answer` hands it to the engine: real tokenizers, prompt builder and site mapping; an
engine that answers at once and records what it was asked (the engine is not the point here)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from medtpe.core.fhir import load_site_mapping
from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.prompt import ChatTemplate
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import Completion, GenerationParams
from medtpe.inference.predictor import Predictor
from medtpe.inference.record import FhirResources, MedsRecord, NoEventsError
from medtpe.inference.sampling import Sampling
from tests.support.cds_support import load_bundle
from tests.support.service_support import synthetic_events
from tests.support.tokenizer_support import smollm2_dir, smollm2_medtpe

MORTALITY = get_task("icu_mortality")


@pytest.fixture(scope="module")
def predictors() -> dict[str, Predictor]:
    """One predictor per mode, on the same MedTPE tokenizer and budget."""
    tokenizer, template = smollm2_medtpe(), ChatTemplate.from_model_dir(smollm2_dir())
    return {mode: Predictor(tokenizer, template, mode, 512) for mode in ("medtpe", "original")}


def events(subject: int = 3, hours: int = 20) -> SubjectEvents:
    return SubjectEvents.from_events(
        [MedsEvent.model_validate(e) for e in synthetic_events(subject, hours)]
    )


class RecordingEngine(InstantEngine):
    """The instant engine, keeping each generation's parameters."""

    def __init__(self) -> None:
        super().__init__(smollm2_dir(), 8192)
        self.calls: list[GenerationParams] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        self.calls.append(params)
        return await super().generate(prompt_ids, params)


def test_a_meds_record_is_prepared_mode_free(predictors: dict[str, Predictor]) -> None:
    record = MedsRecord(events(), prediction_time=None)
    by_mode = {mode: record.prepare(p, MORTALITY) for mode, p in predictors.items()}
    medtpe, original = by_mode["medtpe"], by_mode["original"]
    # the prompt does not depend on the mode: either prepared record serves either engine
    assert medtpe.prompt.text == original.prompt.text
    assert medtpe.segmentation == original.segmentation
    seg = medtpe.segmentation
    assert medtpe.ids("medtpe") == seg.medtpe_ids and medtpe.ids("original") == seg.original_ids
    assert len(seg.medtpe_ids) < len(seg.original_ids)
    for mode, predictor in predictors.items():
        assert predictor.decode(medtpe.ids(mode)) == medtpe.prompt.text
    # the default prediction time: one minute after the last event, on the minute
    last = events().last_time()
    assert last is not None and medtpe.prediction_time is not None
    assert medtpe.prediction_time > last and medtpe.prediction_time.second == 0


def test_fhir_resources_and_their_events_give_one_prompt(
    predictors: dict[str, Predictor],
) -> None:
    predictor = predictors["original"]
    fhir = FhirResources(load_bundle(), load_site_mapping(None)).prepare(predictor, MORTALITY)
    assert fhir.fhir is not None and fhir.fhir.rows
    as_meds = MedsRecord(fhir.events, fhir.prediction_time).prepare(predictor, MORTALITY)
    assert as_meds.prompt.text == fhir.prompt.text and as_meds.fhir is None


def test_a_record_without_events_of_its_patient_is_refused(
    predictors: dict[str, Predictor],
) -> None:
    bundle = {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [{"resource": {"resourceType": "Patient", "id": "p"}}],
    }
    record = FhirResources(bundle, load_site_mapping(None))
    with pytest.raises(NoEventsError, match="no event"):
        record.prepare(predictors["original"], MORTALITY)


def test_answer_decodes_as_the_sampling_says(predictors: dict[str, Predictor]) -> None:
    prepared = MedsRecord(events()).prepare(predictors["medtpe"], MORTALITY)
    engine = RecordingEngine()
    for mode, predictor in predictors.items():
        sampling = Sampling(n_samples=3, temperature=0.7, max_new_tokens=9, seed=5)
        answer = asyncio.run(predictor.answer(engine, prepared, sampling, cache_salt="tenant"))
        # the ids of the predictor's own mode, from the same mode-free prepared record
        assert engine.prompts[-1] == prepared.ids(mode)
        call = engine.calls[-1]
        assert (call.n, call.temperature, call.max_new_tokens) == (3, 0.7, 9)
        assert call.seed == 5 and call.cache_salt == "tenant"
        assert call.constraint is None and call.stop_ids == predictor.stop_ids
        assert call.top_logprobs is not None and len(answer.samples) == 3
        assert answer.probabilities == pytest.approx({"yes": 0.75, "no": 0.25})

    greedy = Sampling(n_samples=3, probabilities=False, constrained=True)
    answer = asyncio.run(predictors["original"].answer(engine, prepared, greedy))
    call = engine.calls[-1]
    assert call.n == 1 and len(answer.samples) == 3  # one greedy answer, counted three times
    assert call.top_logprobs is None and answer.probabilities is None
    assert call.constraint is not None and call.stop_ids == frozenset()


def test_sampling_canonical_form_and_bounds() -> None:
    assert Sampling(temperature=1).as_dict() == {
        "constrained": False,
        "max_new_tokens": 64,
        "n_samples": 1,
        "probabilities": True,
        "seed": None,
        "temperature": 1.0,
    }
    assert list(Sampling().as_dict()) == sorted(Sampling().as_dict())
    assert Sampling(temperature=1).as_dict() == Sampling(temperature=1.0).as_dict()
    for bad in ({"n_samples": 0}, {"temperature": -0.1}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Sampling(**bad)
