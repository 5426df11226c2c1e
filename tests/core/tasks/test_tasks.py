"""Task registry, user task files, and answer parsing on real-looking model outputs."""

from __future__ import annotations

import json

import pytest

from medtpe.core.tasks import (
    TASKS_DIR_ENV,
    TaskFileError,
    UnknownTaskError,
    get_task,
    list_tasks,
    load_task_file,
)
from medtpe.core.tasks.answers import AnswerReading

PHENOTYPES = 25


def test_builtin_tasks():
    assert {"icu_mortality", "phenotyping", "readmission_30d", "pancreatic_cancer_1y"} <= set(
        list_tasks()
    )
    phenotyping = get_task("phenotyping")
    assert phenotyping.label_type == "multilabel" and len(phenotyping.labels) == PHENOTYPES
    assert (
        phenotyping.labels[0] == "Acute and unspecified renal failure"
        and phenotyping.labels[-1] == "Shock"
    )
    for name in ("icu_mortality", "readmission_30d", "pancreatic_cancer_1y"):
        assert get_task(name).label_type == "binary"


def test_unknown_task_lists_known_ones():
    with pytest.raises(UnknownTaskError, match="icu_mortality"):
        get_task("icu_mortalty")


def test_user_message_layout():
    task = get_task("phenotyping")
    message = task.user_message("[static]\nGender: F", "2150-03-02 08:00")
    assert message.index("Options:\nA. Acute and unspecified renal failure") < message.index(
        "Patient record:"
    )
    assert "Y. Shock" in message
    assert message.index("Patient record:\n[static]\nGender: F") < message.index(
        "Prediction time: 2150-03-02 08:00"
    )
    assert message.endswith(task.answer_format())
    assert '{"answer"' in get_task("icu_mortality").answer_format()


# (output, strict reading's (prediction, format_ok), lenient reading's (prediction, format_ok))
BINARY_OUTPUTS = [
    ('{"answer": "yes"}', (True, True), (True, True)),
    ('{"answer": "no"}', (False, True), (False, True)),
    ('  {"answer": "no"}\n', (False, True), (False, True)),
    ('```json\n{"answer": "Yes"}\n```', (None, False), (True, True)),
    ('```\n{\n  "answer": "NO"\n}\n```', (None, False), (False, True)),
    ('{\n  "answer": "NO"\n}', (False, True), (False, True)),
    (
        'Based on the elevated lactate and hypotension, the risk is high.\n{"answer": "yes"}',
        (None, False),
        (True, True),
    ),
    # text after the answer: the answer stands, the format does not comply (strict)
    (
        '{"answer": "no"}\nThe patient is stable and likely to survive.',
        (False, False),
        (False, True),
    ),
    # the run-on answer of a MedTPE model: the first object is the answer, never the last
    ('{"answer": "yes"} or {"answer": "no"}', (True, False), (True, True)),
    ("{'answer': 'yes'}", (None, False), (True, True)),
    ('{"answer": true}', (True, True), (True, True)),
    ('{"answer": false}', (False, True), (False, True)),
    ("{'answer': False}", (None, False), (False, True)),
    ('{"answer": 1}', (True, True), (True, True)),
    ('{"answer": 0}', (False, True), (False, True)),
    ('{"answer": "1"}', (True, True), (True, True)),
    ('{"answer": "Yes."}', (True, True), (True, True)),
    ('{"answer": yes}', (None, False), (True, True)),
    ('{"Answer": "No"}', (None, False), (False, True)),
    ('{"answer": "died"}', (True, True), (True, True)),  # task-specific synonym from the YAML
    ('{"answer": "survived"}', (False, True), (False, True)),
    ('{"answer": ["yes"]}', (True, True), (True, True)),
    (
        'Example: {"answer": "yes"} or {"answer": "no"}. My answer: {"answer": "no"}',
        (None, False),
        (True, True),
    ),
    ('{"answer": "yes", "confidence": 0.8}', (None, False), (True, True)),
    ("Yes", (None, False), (None, False)),  # not the JSON form
    ("The patient will likely die.", (None, False), (None, False)),
    ('{"answer": "maybe"}', (None, False), (None, False)),
    ('{"answer": "yes and no"}', (None, False), (None, False)),
    ('{"answer": 0.85}', (None, False), (None, False)),
    ('{"answer": 2}', (None, False), (None, False)),
    ('{"answer": null}', (None, False), (None, False)),
    ('{"answer": ["yes", "no"]}', (None, False), (None, False)),
    ('{"prediction": "yes"}', (None, False), (None, False)),
    ('{"answer": "yes"', (None, False), (None, False)),  # unterminated
    ("", (None, False), (None, False)),
    ("{}", (None, False), (None, False)),
]


def _reading(task_name: str, reading: str):
    return get_task(task_name).model_copy(update={"answer_reading": AnswerReading(reading)})


@pytest.mark.parametrize(("output", "strict", "lenient"), BINARY_OUTPUTS)
def test_parse_binary_answers(output, strict, lenient):
    assert get_task("icu_mortality").answer_reading is AnswerReading.STRICT
    assert get_task("icu_mortality").parse_answer(output)[:2] == strict
    assert _reading("icu_mortality", "lenient").parse_answer(output)[:2] == lenient


PHENO_OUTPUTS = [
    (
        '{"answer": ["A", "D"]}',
        ["Acute and unspecified renal failure", "Cardiac dysrhythmias"],
        True,
    ),
    (
        '{"answer": ["d", "a", "A"]}',
        ["Acute and unspecified renal failure", "Cardiac dysrhythmias"],
        True,
    ),
    (
        '{"answer": "A, D"}',
        ["Acute and unspecified renal failure", "Cardiac dysrhythmias"],
        True,
    ),
    ('{"answer": ["Shock", "Essential hypertension"]}', ["Essential hypertension", "Shock"], True),
    ('{"answer": ["Y. Shock"]}', ["Shock"], True),
    ('{"answer": ["(X) Septicemia (except in labor)"]}', ["Septicemia (except in labor)"], True),
    ('{"answer": ["septicemia"]}', ["Septicemia (except in labor)"], True),  # unique prefix
    ('{"answer": []}', [], True),
    ('{"answer": "none"}', [], True),
    ('{"answer": ["Z"]}', None, False),  # no 26th phenotype
    ('{"answer": ["Diabetes mellitus"]}', None, False),  # ambiguous prefix
    ('{"answer": ["A", "heart attack"]}', None, False),  # one unknown item rejects the answer
    ('{"answer": [1, 4]}', None, False),
    ('{"answer": true}', None, False),
    ("A, D", None, False),
]


@pytest.mark.parametrize(("output", "prediction", "ok"), PHENO_OUTPUTS)
def test_parse_multilabel_answers(output, prediction, ok):
    assert get_task("phenotyping").parse_answer(output)[:2] == (prediction, ok)


def test_lenient_reading_takes_python_spelling_in_code_fences():
    task = _reading("phenotyping", "lenient")
    assert task.parse_answer("```json\n{'answer': ['N']}\n```") == (
        ["Essential hypertension"],
        True,
        "\n```",
    )
    assert get_task("phenotyping").parse_answer("```json\n{'answer': ['N']}\n```")[:2] == (
        None,
        False,
    )


def test_trailing_text_is_reported_never_parsed():
    task = get_task("icu_mortality")
    parsed = task.parse_answer('{"answer": "yes"}\n\nThe patient died during this ICU stay.')
    assert parsed == (True, False, "\n\nThe patient died during this ICU stay.")
    assert task.parse_answer('{"answer": "no"}  \n') == (False, True, "")


def test_parse_label_values():
    assert get_task("icu_mortality").parse_label(True) is True
    assert get_task("icu_mortality").parse_label(0) is False
    assert get_task("phenotyping").parse_label("A|Shock") == [
        "Acute and unspecified renal failure",
        "Shock",
    ]
    assert get_task("phenotyping").parse_label("") == []
    with pytest.raises(ValueError, match="icu_mortality"):
        get_task("icu_mortality").parse_label(3.5)


TRIAGE = {
    "name": "triage",
    "title": "Triage level",
    "label_type": "multiclass",
    "instruction": "Assign the triage level.",
    "question": "Which level?",
    "labels": ["Resuscitation", "Emergent", "Urgent"],
}


def test_user_task_from_yaml_and_json(tmp_path, monkeypatch):
    (tmp_path / "triage.json").write_text(json.dumps(TRIAGE))
    (tmp_path / "sepsis.yaml").write_text(
        "name: sepsis_6h\ntitle: Sepsis in 6 h\nlabel_type: binary\n"
        "instruction: Predict sepsis onset within 6 hours.\n"
        "question: Will sepsis start within 6 hours?\n"
    )
    assert load_task_file(tmp_path / "triage.json").name == "triage"
    monkeypatch.setenv(TASKS_DIR_ENV, str(tmp_path))
    assert {"triage", "sepsis_6h", "icu_mortality"} <= set(list_tasks())
    triage = get_task("triage")
    assert triage.parse_answer('{"answer": "B"}')[:2] == ("Emergent", True)
    assert triage.parse_answer('{"answer": "urgent"}')[:2] == ("Urgent", True)
    assert triage.parse_answer('{"answer": ["A", "B"]}')[:2] == (None, False)
    assert get_task("sepsis_6h").parse_answer('{"answer": "no"}')[:2] == (False, True)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("name: x\n", "title"),  # missing fields
        ("name: Bad Name\ntitle: t\nlabel_type: binary\ninstruction: i\nquestion: q\n", "name"),
        ("name: x\ntitle: t\nlabel_type: ordinal\ninstruction: i\nquestion: q\n", "label_type"),
        (
            "name: x\ntitle: t\nlabel_type: multilabel\ninstruction: i\nquestion: q\n"
            "labels: [only]\n",
            "labels",
        ),
        (
            "name: x\ntitle: t\nlabel_type: binary\ninstruction: i\nquestion: q\nlabels: [a, b]\n",
            "labels",
        ),
        (
            "name: x\ntitle: t\nlabel_type: binary\ninstruction: i\nquestion: q\nsurprise: 1\n",
            "surprise",
        ),
        ("- just a list\n", "mapping"),
        ("name: [unclosed\n", "cannot read"),
    ],
)
def test_invalid_task_files(tmp_path, content, match):
    path = tmp_path / "task.yaml"
    path.write_text(content)
    with pytest.raises(TaskFileError, match=match):
        load_task_file(path)


def test_tasks_dir_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv(TASKS_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(TaskFileError, match=TASKS_DIR_ENV):
        list_tasks()


@pytest.mark.parametrize(
    ("name", "completion", "prediction"),
    [
        ("icu_mortality", 'yes"}', True),
        ("icu_mortality", 'no"}\n', False),
        (
            "phenotyping",
            '"A", "D"]}',
            ["Acute and unspecified renal failure", "Cardiac dysrhythmias"],
        ),
    ],
)
def test_prefilled_answer_parses_with_its_prefix(name, completion, prediction):
    task = get_task(name)
    assert task.prefill_answer
    assert task.parse_answer(task.response_prefix + completion) == (prediction, True, "")
    assert task.parse_answer(completion)[1] is False


def test_prefill_can_be_turned_off():
    task = get_task("icu_mortality").model_copy(update={"prefill_answer": False})
    assert task.response_prefix == ""
