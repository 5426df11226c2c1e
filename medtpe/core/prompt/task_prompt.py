"""Task prompts for one record: rendered events inside the task's user message (placed by the
prompt layout, `medtpe.core.prompt.layout`), through the model's chat template, within an input
budget counted in ORIGINAL tokenizer tokens; several tasks of one record share its rendering."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

import meds
import numpy as np

from medtpe.core.meds.events import MAX_EVENTS_PER_RECORD, MedsEvent, SubjectEvents, to_naive_utc
from medtpe.core.prompt.chat_template import ChatTemplate
from medtpe.core.prompt.layout import DEFAULT_LAYOUT, PromptLayout, user_message
from medtpe.core.prompt.render import BudgetTooSmallError, RenderedRecord, render_record
from medtpe.core.prompt.windowing import (
    SLIDING_WINDOW,
    Windowing,
    WindowPolicy,
    stable_starts,
    window_events,
)
from medtpe.core.tasks import Task, get_task, list_tasks
from medtpe.core.tokenizer.base import BaseTokenizer
from medtpe.core.tokenizer.medtpe_tokenizer import MedTPETokenizer

DEFAULT_MAX_INPUT_TOKENS = 8192
_MAX_FIT_ROUNDS = 4
_RECORD_SLOT = "\x00medtpe-record\x00"
_NO_DESCRIPTIONS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Prompt:
    """The final prompt (chat template applied) as text and original ids, and what went into it.

    `text` is `head + record_text + tail`; `tail` ends with the task's `response_prefix`, the
    start of the assistant's answer (prepend it to the generated text before parsing). Only the
    chat template's parts (`head`, `tail`) may hold special tokens; the record is encoded as
    plain text, so an event reading `<|im_end|>` cannot end the user's turn. In the
    `record-first` layout `head + record_text` is the same for every task of one record, budget
    and prediction time (`shared_ids`).
    """

    head: str
    record_text: str
    tail: str
    head_ids: list[int]
    record_ids: list[int]
    tail_ids: list[int]
    response_prefix: str
    n_events_total: int
    n_events_kept: int
    reach: datetime | None = None
    """How far back the text depends on the record: it shows and weighs no event at or before
    `reach` (the newest event the fit left out, or an earlier stable window start); None: it
    depends on every event (the whole record shown)."""
    layout: PromptLayout = DEFAULT_LAYOUT
    shell_tokens: int | None = None
    """`record-first`: the tokens the record's budget left for the text around it, the longest
    of the tasks asked together (so each got the same record); None in `task-first`."""

    def reaches(self, horizon: datetime | None) -> bool:
        """Whether the text could show or depend on an event at or before `horizon` (the
        stand-ins of `FhirRecord.horizon`): then more of the record must be read."""
        return horizon is not None and (self.reach is None or self.reach <= horizon)

    @property
    def text(self) -> str:
        """The whole prompt text."""
        return self.head + self.record_text + self.tail

    @property
    def base_ids(self) -> list[int]:
        """The whole prompt in original-tokenizer ids."""
        return self.head_ids + self.record_ids + self.tail_ids

    @property
    def n_tokens_original(self) -> int:
        """Prompt length in original-tokenizer tokens."""
        return len(self.head_ids) + len(self.record_ids) + len(self.tail_ids)

    @property
    def shared_ids(self) -> list[int]:
        """The head and the record in original ids: in the `record-first` layout, what every
        task of the record shares."""
        return self.head_ids + self.record_ids

    def medtpe_ids(self, tokenizer: MedTPETokenizer, shared: list[int] | None = None) -> list[int]:
        """The prompt in MedTPE ids, from the original ids (one base pass serves both), except
        for a record holding characters only the byte fallback can spell. `task-first`: the
        artefact's plain tail (`MedTPETokenizer.plain_tail`) counted over the whole prompt;
        `record-first`: `shared_medtpe_ids` (or `shared`, computed before for another task of
        the record), then the task's tail unmerged, so the shared ids are the same for every
        task."""
        if self.layout is PromptLayout.TASK_FIRST:
            if not tokenizer.needs_fallback(self.record_text):
                return tokenizer.encode_ids(self.base_ids)
            return tokenizer.encode_parts([self.head_ids, self.record_text, self.tail_ids])
        if shared is None:
            shared = self.shared_medtpe_ids(tokenizer)
        return shared + tokenizer.encode_ids(self.tail_ids, merge=False)

    def shared_medtpe_ids(self, tokenizer: MedTPETokenizer) -> list[int]:
        """The head and the record in MedTPE ids, merged up to the artefact's plain tail counted
        over them (the `record-first` layout's shared part)."""
        if not tokenizer.needs_fallback(self.record_text):
            return tokenizer.encode_ids(self.shared_ids)
        return tokenizer.encode_parts([self.head_ids, self.record_text])


def _reach(shown: SubjectEvents, n_kept: int) -> datetime | None:
    """The time of the newest event the newest-first fit left out (None: none left out): every
    event the fit keeps or weighs is after it, and none at or before it changes the text (the
    omission line counts them all, stand-ins included)."""
    times = shown.times[shown.n_static :]
    n_left_out = len(times) - max(0, n_kept - shown.n_static)
    return times[n_left_out - 1].astype(datetime) if n_left_out > 0 else None


def format_time(time: datetime) -> str:
    """`YYYY-MM-DD HH:MM` (seconds only when present), as in the rendered record."""
    return time.strftime(
        "%Y-%m-%d %H:%M:%S" if time.second or time.microsecond else "%Y-%m-%d %H:%M"
    )


def _shell(
    layout: PromptLayout,
    task: Task,
    when: str | None,
    chat_template: ChatTemplate,
    base_tokenizer: BaseTokenizer,
) -> tuple[str, str, list[int], list[int]]:
    """The prompt's text around the record, the chat template's `head` and `tail` (the tail
    ending in the task's response prefix), and their original ids."""
    messages = [{"role": "user", "content": user_message(layout, task, _RECORD_SLOT, when)}]
    if task.system_prompt:
        messages.insert(0, {"role": "system", "content": task.system_prompt})
    shell = chat_template.render(messages, add_generation_prompt=True).split(_RECORD_SLOT)
    if len(shell) != 2:
        raise ValueError("the chat template must place the user message verbatim, exactly once")
    head, tail = shell[0], shell[1] + task.response_prefix
    head_ids = base_tokenizer.encode(head, special_tokens=True)
    tail_ids = base_tokenizer.encode(tail, special_tokens=True)
    return head, tail, head_ids, tail_ids


@dataclass
class _RecordFit:
    """The record rendered within what the prompt's shell leaves of `max_input_tokens`; when the
    rendered ids run over (the record's ids, not the renderer's count), the budget is cut by the
    overshoot and the record rendered again, the cut kept for later fits (`too_small` when
    `_MAX_FIT_ROUNDS` do not fit)."""

    events: SubjectEvents
    descriptions: Mapping[str, str]
    prediction_time: datetime | None
    base_tokenizer: BaseTokenizer
    max_input_tokens: int
    shell_tokens: int
    too_small: BudgetTooSmallError
    budget: int = field(init=False)
    """The record's budget: what the shell leaves, less the overshoots seen so far."""

    def __post_init__(self) -> None:
        self.budget = self.max_input_tokens - self.shell_tokens

    def __call__(self, window_start: datetime | None) -> tuple[RenderedRecord, list[int]]:
        """The record rendered from `window_start` (None: the newest events that fit) and its
        original ids."""
        for _ in range(_MAX_FIT_ROUNDS):
            try:
                record = render_record(
                    self.events,
                    self.descriptions,
                    self.prediction_time,
                    self.base_tokenizer,
                    self.budget,
                    window_start=window_start,
                )
            except BudgetTooSmallError as exc:
                raise self.too_small from exc
            record_ids = (
                record.ids if record.ids is not None else self.base_tokenizer.encode(record.text)
            )
            n_tokens = self.shell_tokens + len(record_ids)
            if n_tokens <= self.max_input_tokens:
                return record, record_ids
            self.budget -= n_tokens - self.max_input_tokens
        raise self.too_small


def build_prompt(
    task: Task | str,
    events: SubjectEvents | Sequence[MedsEvent],
    prediction_time: datetime | None,
    base_tokenizer: BaseTokenizer,
    chat_template: ChatTemplate,
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
    descriptions: Mapping[str, str] | None = None,
    *,
    windowing: Windowing = SLIDING_WINDOW,
    horizon: datetime | None = None,
    layout: PromptLayout = DEFAULT_LAYOUT,
    shell_tokens: int | None = None,
) -> Prompt:
    """The prompt of one task (`build_prompts` with one task)."""
    return build_prompts(
        [task],
        events,
        prediction_time,
        base_tokenizer,
        chat_template,
        max_input_tokens,
        descriptions,
        windowing=windowing,
        horizon=horizon,
        layout=layout,
        shell_tokens=shell_tokens,
    )[0]


def build_prompts(
    tasks: Sequence[Task | str],
    events: SubjectEvents | Sequence[MedsEvent],
    prediction_time: datetime | None,
    base_tokenizer: BaseTokenizer,
    chat_template: ChatTemplate,
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
    descriptions: Mapping[str, str] | None = None,
    *,
    windowing: Windowing = SLIDING_WINDOW,
    horizon: datetime | None = None,
    layout: PromptLayout = DEFAULT_LAYOUT,
    shell_tokens: int | None = None,
) -> list[Prompt]:
    """The prompt of each of `tasks` about one record, each whole text at most
    `max_input_tokens` original tokens; which events are kept is the `windowing` policy's
    choice (default: the newest that fit, see `medtpe.core.prompt.windowing`).
    `prediction_time=None` uses every event (and states no prediction time). `Prompt.reach` says
    how far back the text depends on the record; `horizon`: the events at or before it may be
    stand-ins (`FhirRecord.horizon`): once the prompt reaches it (`Prompt.reaches`) no further
    stable window start is fitted.

    `record-first` (`layout`): the record is rendered once, within what the longest text
    around it of `tasks` (at least `shell_tokens`, a receipt's `Prompt.shell_tokens`) leaves of
    the budget, so every task gets the same record and the same ids up to its end.
    `task-first`: each task's record within what its own text leaves.
    """
    if not tasks:
        raise ValueError("build_prompts needs at least one task")
    resolved = [get_task(task) if isinstance(task, str) else task for task in tasks]
    if not isinstance(events, SubjectEvents):
        events = SubjectEvents.from_events(list(events))
    if prediction_time is not None:
        prediction_time = to_naive_utc(prediction_time)
    when = format_time(prediction_time) if prediction_time is not None else None
    shells = [_shell(layout, task, when, chat_template, base_tokenizer) for task in resolved]
    sizes = [len(head_ids) + len(tail_ids) for _, _, head_ids, tail_ids in shells]
    reserve = None
    if layout is PromptLayout.RECORD_FIRST:
        reserve = max(sizes) if shell_tokens is None else max(shell_tokens, *sizes)
        sizes = [reserve] * len(sizes)
    fits: dict[int, tuple[RenderedRecord, list[int], datetime | None]] = {}
    prompts = []
    for task, (head, tail, head_ids, tail_ids), size in zip(resolved, shells, sizes, strict=True):
        if size not in fits:
            too_small = BudgetTooSmallError(
                f"max_input_tokens={max_input_tokens} cannot hold the {task.name} prompt "
                f"({size} tokens without a record)"
            )
            fit = _RecordFit(
                events,
                descriptions or _NO_DESCRIPTIONS,
                prediction_time,
                base_tokenizer,
                max_input_tokens,
                size,
                too_small,
            )
            fits[size] = _window(fit, events, prediction_time, windowing, horizon)
        record, record_ids, reach = fits[size]
        prompts.append(
            Prompt(
                head,
                record.text,
                tail,
                head_ids,
                record_ids,
                tail_ids,
                task.response_prefix,
                record.n_events_total,
                record.n_events_kept,
                reach,
                layout,
                reserve,
            )
        )
    return prompts


def _window(
    fit: _RecordFit,
    events: SubjectEvents,
    prediction_time: datetime | None,
    windowing: Windowing,
    horizon: datetime | None,
) -> tuple[RenderedRecord, list[int], datetime | None]:
    """The record `fit` renders under `windowing` (the newest events that fit, or a stable
    window start), its original ids and its reach (`Prompt.reach`)."""
    record, record_ids = fit(None)
    shown = events.before(prediction_time) if prediction_time is not None else events
    reach = _reach(shown, record.n_events_kept)
    reached = horizon is not None and (reach is None or reach <= horizon)
    if windowing.policy is WindowPolicy.STABLE and not reached:
        for start in stable_starts(shown, record.n_events_kept, windowing.grid_hours):
            reach = min(reach, start) if reach is not None else start
            if horizon is not None and start <= horizon:
                break
            record, record_ids = fit(start)
            in_window = len(window_events(shown, start))
            if record.n_events_kept == in_window:
                break
    return record, record_ids, reach


_LATEST = datetime(9999, 12, 31, 23, 59, 59)


def min_input_tokens(
    base_tokenizer: BaseTokenizer,
    chat_template: ChatTemplate,
    tasks: Sequence[Task | str] | None = None,
    layout: PromptLayout = DEFAULT_LAYOUT,
) -> int:
    """The smallest `max_input_tokens` with which `build_prompt` holds every record for each
    of `tasks` (default: every registered task) in `layout`: the longest prompt without events,
    stating a prediction time, plus the lines a record cut to the budget always shows at their
    longest (the age, the count of omitted events of a record of `MAX_EVENTS_PER_RECORD`)."""
    shell = max(
        build_prompt(
            task, [], _LATEST, base_tokenizer, chat_template, 2**31, layout=layout
        ).n_tokens_original
        for task in (tasks if tasks is not None else list_tasks())
    )
    content = base_tokenizer.content_fingerprint
    if content not in _CUT_RECORD_TOKENS:
        _CUT_RECORD_TOKENS[content] = _cut_record_tokens(base_tokenizer)
    return shell + _CUT_RECORD_TOKENS[content]


_CUT_RECORD_TOKENS: dict[str, int] = {}
"""`_cut_record_tokens` by the base tokenizer's content fingerprint: found once per vocabulary
in a process (each search renders a record of `MAX_EVENTS_PER_RECORD` events about ten times,
~0.2 s), where every service start and model load asks for it."""


def _cut_record_tokens(base_tokenizer: BaseTokenizer) -> int:
    """The smallest record budget `render_record` holds the longest record in with all its
    events left out: born in the year 1, scored in 9999, `MAX_EVENTS_PER_RECORD` events
    omitted (searched from its text without the count of omitted events)."""
    n = MAX_EVENTS_PER_RECORD
    events = SubjectEvents.from_columns(
        0,
        np.full(n, np.datetime64("0001-01-01T00:00:00", "us")),
        [meds.birth_code] * n,
        np.full(n, np.nan),
        [None] * n,
    )

    def fits(budget: int) -> bool:
        try:
            render_record(events, _NO_DESCRIPTIONS, _LATEST, base_tokenizer, budget)
        except BudgetTooSmallError:
            return False
        return True

    uncounted = render_record(
        events, _NO_DESCRIPTIONS, _LATEST, base_tokenizer, window_start=_LATEST
    )
    low = high = uncounted.n_tokens or 1
    while not fits(high):
        low, high = high + 1, 2 * high
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low
