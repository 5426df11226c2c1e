"""Answer-option probabilities from first-token logprobs: the prefix rules, ambiguous tokens,
normalisation, no mass, and decoding by the mode's tokenizer (MedTPE tokens as their strings)."""

from __future__ import annotations

import math

import pytest

from medtpe.core.prompt import ChatTemplate
from medtpe.core.tasks import Task, get_task
from medtpe.core.tasks.option_probabilities import (
    matching_option,
    option_probabilities,
    positive_probability,
)
from medtpe.inference.predictor import Predictor
from tests.support.tokenizer_support import smollm2_dir, smollm2_medtpe

YES_NO = ("yes", "no")
MORTALITY = get_task("icu_mortality")


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("yes", "yes"),
        ("Yes", "yes"),  # case-insensitive
        (" YES", "yes"),  # leading whitespace stripped
        ("y", "yes"),  # a non-empty prefix of the option
        ("Ye", "yes"),
        ('yes"}', "yes"),  # starts with the option
        ("no", "no"),
        ("\nn", "no"),
        ("normal", "no"),  # starts with "no": counts, as the rule says
        ("ymetry", None),  # neither a prefix of "yes" nor starting with it
        ("maybe", None),
        ("{", None),
        (" ", None),  # empty once stripped
        ("", None),
        ("yes ", "yes"),  # only leading whitespace is stripped
        (" yesno", "yes"),
    ],
)
def test_matching_option(text: str, option: str | None) -> None:
    assert matching_option(text, YES_NO) == option


def test_ambiguous_tokens_count_toward_no_option() -> None:
    options = ("yes", "yellow", "no")
    assert matching_option("ye", options) is None  # a prefix of two options
    assert matching_option("Y", options) is None
    assert matching_option("yel", options) == "yellow"
    assert matching_option("yes", options) == "yes"
    # starts with "yes" only
    assert matching_option(" yesterday", options) == "yes"
    # starts with "no" and is a prefix of "none": two options
    assert matching_option("no", ("no", "none")) is None
    probs = option_probabilities(
        [("ye", math.log(0.5)), ("yel", math.log(0.1)), ("no", math.log(0.3))], options
    )
    assert probs == {"yes": 0.0, "yellow": pytest.approx(0.25), "no": pytest.approx(0.75)}


def test_probabilities_sum_the_tokens_of_each_option_and_normalise() -> None:
    tokens = [
        ("yes", math.log(0.4)),
        (" Yes", math.log(0.2)),
        ("no", math.log(0.1)),
        ("N", math.log(0.05)),
        ("{", math.log(0.2)),  # no option: left out of the normalisation
    ]
    probs = option_probabilities(tokens, YES_NO)
    assert probs == {"yes": pytest.approx(0.6 / 0.75), "no": pytest.approx(0.15 / 0.75)}
    assert sum(probs.values()) == pytest.approx(1.0)


def test_an_option_without_mass_gets_zero() -> None:
    assert option_probabilities([("yes", -0.1), ("Y", -3.0)], YES_NO) == {"yes": 1.0, "no": 0.0}


def test_no_mass_on_any_option_is_none() -> None:
    assert option_probabilities([("{", -0.1), ("maybe", -2.0)], YES_NO) is None
    assert option_probabilities([], YES_NO) is None


def test_tiny_logprobs_do_not_underflow() -> None:
    probs = option_probabilities([("yes", -1000.0), ("no", -1000.0 - math.log(3))], YES_NO)
    assert probs == {"yes": pytest.approx(0.75), "no": pytest.approx(0.25)}


def test_task_options_and_positive_probability() -> None:
    assert MORTALITY.answer_options == ("yes", "no")
    assert MORTALITY.positive_option == "yes"
    assert positive_probability(MORTALITY, {"yes": 0.7, "no": 0.3}) == 0.7
    assert positive_probability(MORTALITY, None) is None
    phenotyping = get_task("phenotyping")
    assert phenotyping.answer_options == () and phenotyping.positive_option is None
    assert positive_probability(phenotyping, {"A": 1.0}) is None


def _choice_task() -> Task:
    return Task(
        name="choice",
        title="Choice",
        label_type="multiclass",
        instruction="Pick one.",
        question="Which?",
        labels=["Alpha", "Beta"],
    )


@pytest.mark.parametrize("mode", ["medtpe", "original"])
def test_predictor_decodes_ids_with_the_mode_s_tokenizer(mode: str) -> None:
    tokenizer = smollm2_medtpe()
    predictor = Predictor(tokenizer, ChatTemplate.from_model_dir(smollm2_dir()), mode, 512)
    [yes], [no], [a] = (tokenizer.base.encode(word) for word in ("yes", "no", "A"))
    logprobs = {yes: math.log(0.3), no: math.log(0.1), 2: math.log(0.5)}  # 2: <|im_end|>
    assert predictor.option_probabilities(MORTALITY, logprobs) == {
        "yes": pytest.approx(0.75),
        "no": pytest.approx(0.25),
    }
    assert predictor.option_probabilities(MORTALITY, None) is None
    assert predictor.option_probabilities(get_task("phenotyping"), logprobs) is None
    # a MedTPE id reuses an evicted base id: "Blood):" in medtpe mode, " Injection" in original
    blood = next(t.id for t in tokenizer.new_tokens if tokenizer.decode([t.id]) == "Blood):")
    choice = predictor.option_probabilities(_choice_task(), {blood: math.log(0.3), a: -1.0})
    if mode == "medtpe":
        assert choice == {"A": pytest.approx(0.55, abs=0.01), "B": pytest.approx(0.45, abs=0.01)}
    else:
        assert tokenizer.base.decode([blood]) == " Injection"
        assert choice == {"A": 1.0, "B": 0.0}
