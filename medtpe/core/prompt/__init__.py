"""The prompt: a record's MEDS events rendered as text, windowed to an input budget counted in
original tokens, inside the task's instruction and the model's chat template.

    from medtpe.core.prompt import ChatTemplate, build_prompt
    from medtpe.core.tokenizer import BaseTokenizer

    prompt = build_prompt(
        "icu_mortality", events, prediction_time,
        BaseTokenizer.load(model_dir), ChatTemplate.from_model_dir(model_dir),
        max_input_tokens=4096,
    )
    prompt.text  # the whole prompt; it ends with the start of the answer

`build_prompts` builds several tasks' prompts about one record; in the default `record-first`
layout (`layout`) they share their ids up to the end of the record.

Modules: `task_prompt` (`build_prompt`, `build_prompts`), `layout` (where the record sits),
`render` (events as a readable record), `windowing` (which stretch of a record a budget shows),
`chat_template` (a model directory's template, rendered as transformers does), `piece_tokens`
(token ids of repeated record lines).
"""

from medtpe.core.prompt.chat_template import ChatTemplate
from medtpe.core.prompt.layout import PromptLayout
from medtpe.core.prompt.render import render_record
from medtpe.core.prompt.task_prompt import Prompt, build_prompt, build_prompts
from medtpe.core.prompt.windowing import Windowing, WindowPolicy

__all__ = [
    "ChatTemplate",
    "Prompt",
    "PromptLayout",
    "WindowPolicy",
    "Windowing",
    "build_prompt",
    "build_prompts",
    "chat_template",
    "layout",
    "render",
    "render_record",
    "task_prompt",
    "windowing",
]
