"""Constrained answers under the MedTPE tokenizer, without an engine: the structured-output
grammar the engine gets (`answer_constraint`) compiled by xgrammar (vLLM's backend) against the
default artefact's tokenizer.json. Every answer option must stay reachable, token by token, and
the first allowed tokens must each count toward exactly one option (merged `ye`, `yes`, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medtpe.core.paths import default_artefact_dir
from medtpe.core.tasks import get_task, list_tasks
from medtpe.core.tasks.option_probabilities import matching_option
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.predictor import answer_constraint

xgr = pytest.importorskip("xgrammar", reason="xgrammar comes with the vLLM engine extra")
transformers = pytest.importorskip("transformers")

ARTEFACT = default_artefact_dir()
END_OF_TURN = "<|im_end|>"


@pytest.fixture(scope="module")
def medtpe() -> MedTPETokenizer:
    return MedTPETokenizer.load(ARTEFACT)


@pytest.fixture(scope="module")
def compiler() -> tuple[object, object]:
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(ARTEFACT) / "tokenizer.json"))
    stop = hf.convert_tokens_to_ids(END_OF_TURN)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[stop])
    return xgr.GrammarCompiler(info), info


def compiled(compiler: tuple[object, object], task_name: str, prefill: bool) -> object:
    grammar_compiler, _ = compiler
    task = get_task(task_name).model_copy(update={"prefill_answer": prefill})
    constraint = answer_constraint(task)
    if constraint.regex is not None:
        return grammar_compiler.compile_regex(constraint.regex)
    return grammar_compiler.compile_json_schema(constraint.json_schema)


def allowed_first_tokens(compiler: tuple[object, object], grammar: object) -> list[int]:
    _, info = compiler
    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    words = bitmask[0].tolist()
    return [i for i in range(info.vocab_size) if (words[i // 32] >> (i % 32)) & 1]


def accepts(grammar: object, ids: list[int]) -> bool:
    """Whether the grammar takes these tokens in turn and may then end."""
    matcher = xgr.GrammarMatcher(grammar)
    return all(matcher.accept_token(i) for i in ids) and matcher.is_completed()


def test_binary_first_tokens_each_count_toward_one_option(
    medtpe: MedTPETokenizer, compiler: tuple[object, object]
) -> None:
    grammar = compiled(compiler, "icu_mortality", prefill=True)
    first = allowed_first_tokens(compiler, grammar)
    texts = [medtpe.decode([i]) for i in first]
    assert {"y", "ye", "yes", "n", "no"} <= set(texts)
    options = [matching_option(text, ("yes", "no")) for text in texts]
    assert None not in options and set(options) == {"yes", "no"}


@pytest.mark.parametrize("option", ["yes", "no"])
def test_binary_options_are_reachable_as_medtpe_encodes_them(
    medtpe: MedTPETokenizer, compiler: tuple[object, object], option: str
) -> None:
    grammar = compiled(compiler, "icu_mortality", prefill=True)
    assert accepts(grammar, medtpe.encode(f'{option}"}}'))
    # and token by token with the shortest merged spellings, e.g. `ye` + `s`
    assert accepts(grammar, [*medtpe.encode(option[:2]), *medtpe.encode(option[2:] + '"}')])
    whole = compiled(compiler, "icu_mortality", prefill=False)
    assert accepts(whole, medtpe.encode(json.dumps({"answer": option})))


def test_every_phenotype_letter_is_reachable(
    medtpe: MedTPETokenizer, compiler: tuple[object, object]
) -> None:
    task = get_task("phenotyping")
    grammar = compiled(compiler, "phenotyping", prefill=True)
    for letter in task.letters:
        assert accepts(grammar, medtpe.encode(f'"{letter}"]}}')), letter
    assert accepts(grammar, medtpe.encode('"A", "C", "Y"]}'))
    assert accepts(grammar, medtpe.encode("]}"))  # none apply
    assert not accepts(grammar, medtpe.encode('"Z"]}'))  # not an option
    whole = compiled(compiler, "phenotyping", prefill=False)
    assert accepts(whole, medtpe.encode(json.dumps({"answer": ["B", "D"]})))


@pytest.mark.parametrize("task_name", list_tasks())
@pytest.mark.parametrize("prefill", [True, False])
def test_every_constraint_is_one_vllm_compiles_with_xgrammar(task_name: str, prefill: bool) -> None:
    """vLLM hands a schema xgrammar cannot take (`uniqueItems`, ...) to a fallback backend that
    refuses it too, so `constrained` would fail at generation time on such a task."""
    backend = pytest.importorskip("vllm.v1.structured_output.backend_xgrammar")
    task = get_task(task_name).model_copy(update={"prefill_answer": prefill})
    constraint = answer_constraint(task)
    if constraint.json_schema is not None:
        schema = json.loads(constraint.json_schema)
        assert not backend.has_xgrammar_unsupported_json_features(schema), schema
