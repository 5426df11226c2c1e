"""The jinja chat-template renderer matches transformers' `apply_chat_template` (test-only use)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from medtpe.core.prompt.chat_template import ChatTemplate, ChatTemplateError
from tests.support.paths import FIXTURES

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SMOLLM2_DIR = FIXTURES / "smollm2"

# A Llama-3-style template: loop controls, raise_exception, strftime_now, tojson, bos_token.
RICH_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = "Today is " + strftime_now("%Y") %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system + '<|eot_id|>' }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {%- if message['content'] == 'skip' %}{% continue %}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim }}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
{{- {"n": messages | length, "text": "é<b>"} | tojson }}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Will the patient die? Reply with JSON only."}],
    [
        {"role": "system", "content": "You are a clinical prediction assistant."},
        {"role": "user", "content": "Patient record:\n[static]\nGender: F\n  indented line\n"},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": '{"answer": "no"}'},
        {"role": "user", "content": "skip"},
        {"role": "user", "content": "ünïcödé — 42 °C"},
    ],
]


def hf_tokenizer(model_dir: Path):
    """A transformers tokenizer for the model dir's chat template (a tiny vocabulary suffices)."""
    model = tokenizers.models.WordLevel(
        {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}, unk_token="<unk>"
    )
    backend = tokenizers.Tokenizer(model)
    backend.save(str(model_dir / "tokenizer.json"))
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture
def smollm2_dir(tmp_path):
    model_dir = tmp_path / "smollm2"
    shutil.copytree(SMOLLM2_DIR, model_dir)
    return model_dir


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_matches_transformers(smollm2_dir, messages, add_generation_prompt):
    ours = ChatTemplate.from_model_dir(smollm2_dir).render(
        messages, add_generation_prompt=add_generation_prompt
    )
    theirs = hf_tokenizer(smollm2_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs


def test_smollm2_default_system_prompt_and_generation_prompt(smollm2_dir):
    text = ChatTemplate.from_model_dir(smollm2_dir).render([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_rich_template_matches_transformers(tmp_path, messages):
    config = {"eos_token": "<|eot_id|>", "chat_template": RICH_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    bos = {"content": "<|begin_of_text|>", "lstrip": False, "rstrip": False, "single_word": False}
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"bos_token": bos}))
    ours = ChatTemplate.from_model_dir(tmp_path).render(messages)
    theirs = hf_tokenizer(tmp_path).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert ours.startswith("<|begin_of_text|>")


def test_chat_template_jinja_file_wins(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}))
    (tmp_path / "chat_template.jinja").write_text("file:{{ messages[0]['content'] }}")
    assert (
        ChatTemplate.from_model_dir(tmp_path).render([{"role": "user", "content": "x"}]) == "file:x"
    )


def test_named_templates_use_default(tmp_path):
    templates = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default"},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    assert ChatTemplate.from_model_dir(tmp_path).render([]) == "default"


def test_errors(tmp_path):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_model_dir(tmp_path)
    with pytest.raises(ChatTemplateError, match="compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="Unknown role"):
        ChatTemplate(RICH_TEMPLATE, {"bos_token": ""}).render([{"role": "tool", "content": "x"}])
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ChatTemplateError, match="JSON"):
        ChatTemplate.from_model_dir(tmp_path)
