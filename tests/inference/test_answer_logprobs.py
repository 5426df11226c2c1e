"""Where the option probabilities are read and what constraint the engine gets, per task and
prefill setting (no engine: the completion is built from the MedTPE tokenizer's own ids)."""

from __future__ import annotations

import json

import pytest

from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.prompt import ChatTemplate
from medtpe.core.tasks import get_task
from medtpe.inference.engines.protocol import AnswerConstraint, Completion
from medtpe.inference.predictor import Predictor, answer_constraint
from tests.support.service_support import synthetic_events
from tests.support.tokenizer_support import smollm2_dir, smollm2_medtpe

MORTALITY = get_task("icu_mortality")
FREE = MORTALITY.model_copy(update={"prefill_answer": False})


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor(smollm2_medtpe(), ChatTemplate.from_model_dir(smollm2_dir()), "medtpe", 512)


def completion(predictor: Predictor, text: str) -> Completion:
    """`text` as generated ids, each position's 'distribution' tagged by its index."""
    ids = predictor.tokenizer.encode(text)
    return Completion(ids, [{i: -float(i)} for i in range(len(ids))])


def test_answer_value_position_without_prefill(predictor: Predictor) -> None:
    events = SubjectEvents.from_events(
        [MedsEvent.model_validate(e) for e in synthetic_events(3, 20)]
    )
    record = predictor.prepare(FREE, events, None)
    text = 'Sure. {"answer": "yes"}'
    output = completion(predictor, text)
    position = next(iter(predictor.value_logprobs(record, output)))
    before = predictor.decode(output.ids[:position])
    assert before.endswith('{"answer": "') and predictor.decode(output.ids[position:]).startswith(
        "yes"
    )
    assert predictor.value_logprobs(record, completion(predictor, "I cannot tell.")) is None


def test_first_position_with_the_prefill(predictor: Predictor) -> None:
    events = SubjectEvents.from_events(
        [MedsEvent.model_validate(e) for e in synthetic_events(3, 20)]
    )
    record = predictor.prepare(MORTALITY, events, None)
    assert predictor.value_logprobs(record, completion(predictor, 'no"}')) == {0: 0.0}


def test_constraint_per_task_and_prefill() -> None:
    assert answer_constraint(MORTALITY) == AnswerConstraint(regex='(yes|no)"\\}')
    schema = json.loads(answer_constraint(FREE).json_schema)
    assert schema["properties"]["answer"] == {"enum": ["yes", "no"]}
    assert schema["required"] == ["answer"] and schema["additionalProperties"] is False
    letters = answer_constraint(get_task("phenotyping")).regex
    assert letters.startswith('("(A|B|') and letters.endswith(r"\]\}")
    with pytest.raises(ValueError, match="exactly one"):
        AnswerConstraint(regex="x", choice=("a",))
    with pytest.raises(ValueError, match="exactly one"):
        AnswerConstraint()
