"""Service-test material: synthetic MEDS records (no patient data, no ../shared needed) and a
small MedTPE artefact for the default model, used only while no default artefact exists."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

# (code, low, high): ICU chart items and labs in MIMIC-IV MEDS spelling, without descriptions.
_MEASUREMENTS = [
    ("LAB//220045//bpm", 55, 140),
    ("LAB//220179//mmHg", 75, 170),
    ("LAB//220180//mmHg", 35, 100),
    ("LAB//220210//insp/min", 8, 35),
    ("LAB//220277//%", 84, 100),
    ("LAB//50931//mg/dL", 65, 320),
    ("LAB//50971//mEq/L", 2.8, 6.2),
    ("LAB//50912//mg/dL", 0.4, 4.5),
    ("LAB//223761//°F", 96, 103.5),
    ("LAB//51222//g/dL", 6.5, 16),
]
_EVENTS = [
    "INFUSION_START//225158",
    "MEDICATION//START//Heparin",
    "DIAGNOSIS//ICD//9//4019",
    "DIAGNOSIS//ICD//10//I10",
    "PROCEDURE//START//225792",
]


def synthetic_events(subject_id: int, n_events: int = 60, seed: int | None = None) -> list[dict]:
    """A plausible ICU record as MEDS JSON events: birth, admission, then measurements."""
    rng = random.Random(subject_id if seed is None else seed)
    start = datetime(2150, 1, 1) + timedelta(days=rng.randint(0, 3000), hours=rng.randint(0, 23))
    events: list[dict[str, Any]] = [
        {"subject_id": subject_id, "time": None, "code": "GENDER//F"},
        {
            "subject_id": subject_id,
            "time": (start - timedelta(days=365 * rng.randint(25, 90))).isoformat(),
            "code": "MEDS_BIRTH",
        },
        {"subject_id": subject_id, "time": start.isoformat(), "code": "ICU_ADMISSION//MICU"},
    ]
    time = start
    for _ in range(n_events):
        time += timedelta(minutes=rng.randint(0, 45))
        if rng.random() < 0.15:
            events.append(
                {"subject_id": subject_id, "time": time.isoformat(), "code": rng.choice(_EVENTS)}
            )
        else:
            code, low, high = rng.choice(_MEASUREMENTS)
            value = round(rng.uniform(low, high), 1)
            events.append(
                {
                    "subject_id": subject_id,
                    "time": time.isoformat(),
                    "code": code,
                    "numeric_value": value,
                }
            )
    return events


def build_test_artefact(model_dir: Path, out_dir: Path, budget: int = 400) -> Path:
    """A MedTPE artefact for `model_dir`, mined from synthetic prompts, with mean-initialised rows
    (no SSFT): a stand-in with the default artefact's layout."""
    from transformers import AutoModelForCausalLM

    from medtpe_core.base_tokenizer import BaseTokenizer
    from medtpe_core.build import build_tokenizer
    from medtpe_core.chat_template import ChatTemplate
    from medtpe_core.meds import MedsEvent
    from medtpe_core.prompting import build_prompt
    from medtpe_core.tasks import get_task, list_tasks
    from training.embedding_init import init_new_rows
    from training.export import model_fingerprint, save_rows

    base = BaseTokenizer.load(model_dir)
    template = ChatTemplate.from_model_dir(model_dir)
    task = get_task("icu_mortality")
    texts = [
        build_prompt(
            task,
            [MedsEvent.model_validate(e) for e in synthetic_events(i, 150)],
            None,
            base,
            template,
            4096,
        ).text
        for i in range(60)
    ]
    protected = [build_prompt(name, [], None, base, template, 4096).text for name in list_tasks()]
    tokenizer = build_tokenizer(base, texts, budget, 2, "static", protected, progress=False)
    tokenizer.save(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    save_rows(out_dir, init_new_rows(model, tokenizer.new_tokens), model_fingerprint(model))
    return out_dir
