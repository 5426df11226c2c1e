"""One record to one prediction: prompt (medtpe_core) → token ids → engine → decoded, parsed answer.

The service calls these steps per request; they hold no HTTP concerns, so any other caller of the
engine (e.g. an offline runner) gets the very same prompt, ids and answer parsing.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections import ChainMap, Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from medtpe.core.meds import SubjectEvents
from medtpe.core.metrics import compression_rate
from medtpe.core.prompt import ChatTemplate, Prompt, build_prompts
from medtpe.core.prompt.layout import DEFAULT_LAYOUT, PromptLayout
from medtpe.core.prompt.windowing import SLIDING_WINDOW, Windowing
from medtpe.core.tasks import Prediction, Task
from medtpe.core.tasks.answers import answer_end_ids
from medtpe.core.tasks.option_probabilities import option_probabilities
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.engines.protocol import (
    AnswerConstraint,
    Completion,
    Engine,
    Finish,
    GenerationParams,
)
from medtpe.inference.sampling import Sampling

if TYPE_CHECKING:  # the FHIR mapping is needed only by FHIR records
    from medtpe.core.fhir import FhirRecord

Mode = Literal["medtpe", "original"]
"""`medtpe`: MedTPE ids into the exported checkpoint; `original`: base ids into the base model."""

OPTION_TOP_K = 20
"""First-token log-probabilities asked for when answer-option probabilities are wanted."""
ANSWER_VALUE_OPENING = re.compile(r"""\{\s*["']answer["']\s*:\s*["']$""")
"""What an answer written without the prefill ends with just before its value's first token."""


def answer_constraint(task: Task) -> AnswerConstraint:
    """The structured-output constraint of a task's answer: a regex of the rest of the answer
    after the prefill, or the answer object's JSON schema without it."""
    if task.response_prefix:
        return AnswerConstraint(regex=task.answer_regex())
    return AnswerConstraint(json_schema=json.dumps(task.answer_schema()))


@dataclass(frozen=True)
class Segmentation:
    """A text under both tokenizers."""

    original_ids: list[int]
    medtpe_ids: list[int]
    n_shared_original: int = 0
    """The leading original ids every task of the record shares (`record-first`: the head and
    the record; 0 in `task-first`)."""
    n_shared_medtpe: int = 0
    """The same leading part in MedTPE ids."""

    @property
    def compression_rate(self) -> float:
        """1 - MedTPE tokens / original tokens."""
        return compression_rate(len(self.original_ids), len(self.medtpe_ids))

    def ids(self, mode: Mode) -> list[int]:
        """The ids a `mode` engine gets: MedTPE ids in `medtpe` mode, base ids in `original`."""
        return self.medtpe_ids if mode == "medtpe" else self.original_ids

    def n_shared(self, mode: Mode) -> int:
        """How many of `ids(mode)` lead every task's prompt about the record."""
        return self.n_shared_medtpe if mode == "medtpe" else self.n_shared_original


@dataclass(frozen=True)
class PreparedRecord:
    """A record's prompt, its ids under both tokenizers and the time each step took; mode-free:
    `ids(mode)` are what an engine of either mode gets."""

    task: Task
    events: SubjectEvents
    """The record's events (a FHIR record's: those read of it, `fhir`)."""
    prompt: Prompt
    prediction_time: datetime | None
    segmentation: Segmentation
    render_s: float
    tokenize_s: float
    max_input_tokens: int
    """The input budget the prompt was built within (original-tokenizer tokens)."""
    fhir: FhirRecord | None = None
    """A FHIR record's mapping (its counts, its display texts), else None."""
    n_tasks: int = 1
    """How many tasks' prompts were prepared from this record together (`render_s` and
    `tokenize_s` are their shared work)."""

    def ids(self, mode: Mode) -> list[int]:
        """The prompt's ids for an engine of `mode` (`Segmentation.ids`)."""
        return self.segmentation.ids(mode)


@dataclass(frozen=True)
class Sample:
    """One generated answer under the answer contract (`medtpe.core.tasks.answers`)."""

    prediction: Prediction | None
    """The first answer object's value (None when there is none)."""
    format_ok: bool
    """The output is that answer object and nothing else (strict reading)."""
    text: str
    trailing: str = ""
    """Text after the answer object: reported, never parsed."""
    finish: Finish = Finish.EOS


@dataclass(frozen=True)
class Answer:
    """The majority answer over the samples of one record."""

    prediction: Prediction | None
    format_ok: bool
    """An answer won the vote and every sample that gave it complies with the answer format."""
    samples: list[Sample]
    generate_s: float
    n_generated: int
    """Tokens generated over all samples (one greedy answer at temperature 0)."""
    probabilities: dict[str, float] | None = None
    """{answer option: probability} from the first answer token, when asked for and the task
    has a closed set of options (see `medtpe.core.tasks.option_probabilities`)."""
    cached_tokens: int = 0
    """Prompt tokens the engine reused from its prefix cache instead of computing them
    (`Completion.cached_tokens`): in the `record-first` layout, the record another task of the
    same record was answered on before."""

    @property
    def n_trailing(self) -> int:
        """Samples that wrote text after their answer object."""
        return sum(bool(sample.trailing) for sample in self.samples)


@dataclass(frozen=True)
class RecordAnswer:
    """What the inference layer answers for one record: the prepared record, the model's
    answer and the seconds from the start of the record's work to the answer; each door
    (`/predict`, `/predict/batch`, a CDS hook, the batch job) builds its own response of it."""

    record: PreparedRecord
    answer: Answer
    total_s: float


def majority_vote(predictions: Sequence[Prediction | None]) -> Prediction | None:
    """The most frequent answer (ties: the earliest sample); None if no sample gave one."""
    answers = [prediction for prediction in predictions if prediction is not None]
    if not answers:
        return None
    counts = Counter(_hashable(answer) for answer in answers)
    winner = max(counts.values())
    return next(a for a in answers if counts[_hashable(a)] == winner)


def _hashable(answer: Prediction | None) -> Any:
    return tuple(answer) if isinstance(answer, list) else answer


def default_prediction_time(events: SubjectEvents) -> datetime | None:
    """One minute after the last timed event, on the minute (None when no event has a time); the
    last event's own time when that minute is the calendar's last (9999-12-31 23:59): the events
    up to and including the prediction time are shown, so no event is lost either way."""
    last = events.last_time()
    if last is None:
        return None
    try:
        return last.replace(second=0, microsecond=0) + timedelta(minutes=1)
    except OverflowError:
        return last


class Predictor:
    """Prompt building, tokenization, generation and answer parsing for one model and mode."""

    def __init__(
        self,
        tokenizer: MedTPETokenizer,
        chat_template: ChatTemplate,
        mode: Mode,
        max_input_tokens: int,
        descriptions: Mapping[str, str] | None = None,
        *,
        windowing: Windowing = SLIDING_WINDOW,
        layout: PromptLayout = DEFAULT_LAYOUT,
        shell_tokens: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.mode = mode
        self.max_input_tokens = max_input_tokens
        self.descriptions = dict(descriptions or {})
        self.windowing = windowing
        self.layout = layout
        self.shell_tokens = shell_tokens
        """`record-first`: the least text around the record every prompt keeps room for (a
        receipt's, to re-derive it); None: the longest of the tasks asked together."""

    def with_layout(self, layout: PromptLayout, shell_tokens: int | None = None) -> Predictor:
        """This predictor in another prompt layout (`shell_tokens` as in `Predictor`)."""
        other = copy.copy(self)
        other.layout, other.shell_tokens = layout, shell_tokens
        return other

    def at_budget(self, max_input_tokens: int) -> Predictor:
        """This predictor with another input budget (never above its own, which fits the
        engine's context)."""
        other = copy.copy(self)
        other.max_input_tokens = min(max_input_tokens, self.max_input_tokens)
        return other

    def segment(self, text: str) -> Segmentation:
        """Plain `text` under the base and the MedTPE tokenizer (lossless MedTPE ids); one base
        pass serves both unless the text needs the byte fallback."""
        base_ids = self.tokenizer.base_encode(text)
        if self.tokenizer.needs_fallback(text):
            return Segmentation(base_ids, self.tokenizer.encode(text))
        return Segmentation(base_ids, self.tokenizer.encode_ids(base_ids))

    def engine_ids(self, segmentation: Segmentation) -> list[int]:
        """The ids this mode feeds the engine: MedTPE ids, or base ids in `original` mode."""
        return segmentation.ids(self.mode)

    def build(
        self,
        tasks: Sequence[Task],
        events: SubjectEvents,
        prediction_time: datetime | None,
        descriptions: Mapping[str, str] | None = None,
        horizon: datetime | None = None,
    ) -> tuple[list[Prompt], datetime | None]:
        """The prompt of each of `tasks` about `events` within the input budget, and the
        prediction time used; `descriptions`: the record's own code descriptions (a FHIR
        record's display texts), for the codes the loaded codes metadata does not describe;
        `horizon`: the events at or before it may be stand-ins (`build_prompts`)."""
        when = prediction_time if prediction_time is not None else default_prediction_time(events)
        prompts = build_prompts(
            tasks,
            events,
            when,
            self.tokenizer.base,
            self.chat_template,
            self.max_input_tokens,
            ChainMap(self.descriptions, descriptions) if descriptions else self.descriptions,
            windowing=self.windowing,
            horizon=horizon,
            layout=self.layout,
            shell_tokens=self.shell_tokens,
        )
        return prompts, when

    def prepare(
        self,
        task: Task,
        events: SubjectEvents,
        prediction_time: datetime | None,
        descriptions: Mapping[str, str] | None = None,
        horizon: datetime | None = None,
    ) -> PreparedRecord:
        """Render the record into the task prompt and tokenize it (CPU work, no engine);
        `descriptions` and `horizon` as in `build`."""
        return self.prepare_all([task], events, prediction_time, descriptions, horizon)[0]

    def prepare_all(
        self,
        tasks: Sequence[Task],
        events: SubjectEvents,
        prediction_time: datetime | None,
        descriptions: Mapping[str, str] | None = None,
        horizon: datetime | None = None,
    ) -> list[PreparedRecord]:
        """`prepare` for each of `tasks` about one record: in the `record-first` layout the
        record is rendered and tokenized once for all of them, and their ids agree up to the
        end of the record (`Segmentation.n_shared`)."""
        start = time.perf_counter()
        prompts, when = self.build(tasks, events, prediction_time, descriptions, horizon)
        rendered = time.perf_counter()
        # the prompt's original ids come from build_prompts (record text as plain text, so event
        # text cannot inject chat turns); MedTPE ids are derived from them
        shared: dict[tuple[int, ...], list[int]] = {}
        segmentations = []
        for prompt in prompts:
            if prompt.layout is PromptLayout.TASK_FIRST:
                segmentations.append(
                    Segmentation(prompt.base_ids, prompt.medtpe_ids(self.tokenizer))
                )
                continue
            key = tuple(prompt.head_ids)
            if key not in shared:
                shared[key] = prompt.shared_medtpe_ids(self.tokenizer)
            ids = prompt.medtpe_ids(self.tokenizer, shared[key])
            segmentations.append(
                Segmentation(prompt.base_ids, ids, len(prompt.shared_ids), len(shared[key]))
            )
        tokenized = time.perf_counter()
        return [
            PreparedRecord(
                task=task,
                events=events,
                prompt=prompt,
                prediction_time=when,
                segmentation=segmentation,
                render_s=rendered - start,
                tokenize_s=tokenized - rendered,
                max_input_tokens=self.max_input_tokens,
                n_tasks=len(tasks),
            )
            for task, prompt, segmentation in zip(tasks, prompts, segmentations, strict=True)
        ]

    def uncompressed(self, prepared: PreparedRecord) -> PreparedRecord:
        """`prepared` with its original ids, every token the artefact evicted decomposed into the
        base tokens it merges (nothing merged), as its MedTPE ids: the uncompressed prompt a
        MedTPE engine reads as the base model reads the original (the fidelity shadow's)."""
        original = prepared.segmentation.original_ids
        decomposed = self.tokenizer.encode_ids(original, merge=False)
        return replace(prepared, segmentation=Segmentation(original, decomposed))

    @cached_property
    def stop_ids(self) -> frozenset[int]:
        """The stop rule in this mode's vocabulary: every id whose text closes an answer object
        (computed once per predictor)."""
        if self.mode == "medtpe":
            return answer_end_ids(self.tokenizer.tokens, self.tokenizer.vocab_size)
        return answer_end_ids(self.tokenizer.base.tokens, self.tokenizer.base.vocab_size)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, with the tokenizer of this mode."""
        if self.mode == "medtpe":
            return self.tokenizer.decode(ids)
        return self.tokenizer.base.decode(ids)

    def option_probabilities(
        self, task: Task, first_logprobs: Mapping[int, float] | None
    ) -> dict[str, float] | None:
        """{answer option: probability} from first-token logprobs (token ids decoded here, by
        this mode's tokenizer, before the core reads the pairs); None without logprobs, options
        or mass on any option."""
        if not first_logprobs or not task.answer_options:
            return None
        tokens = [(self.decode([token_id]), lp) for token_id, lp in first_logprobs.items()]
        return option_probabilities(tokens, task.answer_options)

    def value_logprobs(
        self, record: PreparedRecord, output: Completion
    ) -> Mapping[int, float] | None:
        """The logprobs at the answer value's first token: the first generated position after
        the prefill, else the position after the `{"answer": "` the model wrote."""
        if not output.logprobs or record.prompt.response_prefix:
            return output.first_logprobs
        for position in range(min(len(output.ids), len(output.logprobs))):
            if ANSWER_VALUE_OPENING.search(self.decode(output.ids[:position])):
                return output.logprobs[position]
        return None

    async def answer(
        self,
        engine: Engine,
        prepared: PreparedRecord,
        sampling: Sampling,
        *,
        cache_salt: str | None = None,
    ) -> Answer:
        """Generate `prepared`'s ids in this mode (ending at the answer object's end: `stop_ids`
        in free decoding, the grammar under `sampling.constrained`), decode and read each answer
        under the answer contract; majority vote over `sampling.n_samples` answers; with
        `sampling.probabilities`, the answer options' probabilities from the answer value's first
        token; `cache_salt` keeps the engine's cached prefixes apart per caller (tenant).

        At temperature 0 every sample would be the same greedy answer, so one is generated and
        counted `n_samples` times. With the prefill, the value's first token is the first
        generated one, whose distribution is the same for every sample (before temperature): the
        first sample's is used. Without it, the first sample's position right after its
        `{"answer": "` is used (None when it wrote none).
        """
        start = time.perf_counter()
        task = prepared.task
        n = sampling.n_samples if sampling.temperature > 0 else 1
        want_logprobs = sampling.probabilities and bool(task.answer_options)
        params = GenerationParams(
            n=n,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            top_logprobs=OPTION_TOP_K if want_logprobs else None,
            cache_salt=cache_salt,
            constraint=answer_constraint(task) if sampling.constrained else None,
            # a constraint's grammar ends the answer itself; vLLM's grammar refuses the end of
            # sequence after a stop id it has not accepted, so the stop rule is for free decoding
            stop_ids=frozenset() if sampling.constrained else self.stop_ids,
        )
        outputs = await engine.generate(prepared.ids(self.mode), params)
        generate_s = time.perf_counter() - start
        samples = []
        for output in outputs:
            # the answer as the model gave it: the prefilled start of the turn + what it generated
            text = prepared.prompt.response_prefix + self.decode(output.ids)
            parsed = task.parse_answer(text)
            samples.append(Sample(*parsed[:2], text, parsed.trailing, output.finish))
        if n < sampling.n_samples:
            samples = samples * sampling.n_samples
        prediction = majority_vote([s.prediction for s in samples])
        voters = [s for s in samples if s.prediction is not None and s.prediction == prediction]
        format_ok = bool(voters) and all(s.format_ok for s in voters)
        n_generated = sum(len(output.ids) for output in outputs)
        option_probs = (
            self.option_probabilities(task, self.value_logprobs(prepared, outputs[0]))
            if want_logprobs
            else None
        )
        return Answer(
            prediction,
            format_ok,
            samples,
            generate_s,
            n_generated,
            option_probs,
            outputs[0].cached_tokens if outputs else 0,
        )

    async def answer_all(
        self,
        engine: Engine,
        prepared: Sequence[PreparedRecord],
        sampling: Sampling,
        *,
        cache_salt: str | None = None,
    ) -> list[Answer]:
        """`answer` for each of several tasks' prompts about one record (`prepare_all`): the part
        they share (the head and the record) prefilled once into the engine's prefix cache
        (`Engine.prefill`), then every task asked at once, each reading that part from the
        cache (`Answer.cached_tokens`) and decoding beside the others. Each answer's
        `generate_s` counts the shared prefill: the time its caller waited for it."""
        if len(prepared) < 2:
            return [await self.answer(engine, p, sampling, cache_salt=cache_salt) for p in prepared]
        start = time.perf_counter()
        n_shared = prepared[0].segmentation.n_shared(self.mode)
        if n_shared:
            await engine.prefill(prepared[0].ids(self.mode)[:n_shared], cache_salt=cache_salt)
        shared_s = time.perf_counter() - start
        answers = await asyncio.gather(
            *(self.answer(engine, p, sampling, cache_salt=cache_salt) for p in prepared)
        )
        return [replace(a, generate_s=a.generate_s + shared_s) for a in answers]
