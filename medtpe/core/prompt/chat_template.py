"""A model directory's chat template, rendered with jinja2 as transformers' `apply_chat_template`
does (same sandboxed environment options and extras), without importing transformers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ChatTemplateError(ValueError):
    """No usable chat template, or the template raised an error while rendering."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A jinja chat template plus the special-token strings it may refer to."""

    def __init__(self, template: str, special_tokens: Mapping[str, str] | None = None):
        self.source = template
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ChatTemplate:
        """Read a model dir's `chat_template.jinja`, else `tokenizer_config.json`'s template."""
        path = Path(path)
        config = _read_json(path / "tokenizer_config.json")
        tokens = {
            k: t for k in _SPECIAL_TOKEN_KEYS if (t := _token_text(config.get(k))) is not None
        }
        for key, value in _read_json(path / "special_tokens_map.json").items():
            if (
                key in _SPECIAL_TOKEN_KEYS
                and key not in tokens
                and (text := _token_text(value)) is not None
            ):
                tokens[key] = text
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            return cls(jinja_file.read_text(encoding="utf-8"), tokens)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            template = next(
                (t.get("template") for t in template if t.get("name") == "default"), None
            )
        if not isinstance(template, str):
            raise ChatTemplateError(
                f"{path}: no chat template (chat_template.jinja or tokenizer_config.json)"
            )
        return cls(template, tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The conversation as the model's prompt text (special tokens as text)."""
        try:
            return self._template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **kwargs},
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"{path}: not valid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}
