"""The model card, generated from what the served model is made of, never written by hand.

`build_model_card` reads the artefact's manifest (content digest, the budgets its fidelity gate
passed at, with their figures), its build report (`build_report.json`: data, split, compression),
its evaluation report (`evaluation_report.json`: clinical figures with their records and dates,
written by `evaluation_report` from a stored evaluation run), the task definitions served and the
product's documented limits, and returns the card as JSON: CHAI's Applied Model Card (v0.2)
sections under `card` (the XML form, `medtpe.model_card.xml`, is the same tree) and the
machine-readable facts under `facts`. The same inputs give the same card, byte for byte, so its
digest (`card_digest`) identifies it (the FHIR DocumentReference of the write-back).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from medtpe.core.tasks import Task
from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle

CHAI_FORMAT = "CHAI Applied Model Card v0.2"
CHAI_NAMESPACE = "https://mc.chai.org/v0.2/schema.xsd"
BUILD_REPORT_FILE = "build_report.json"
EVALUATION_FILE = "evaluation_report.json"
DEVELOPER = "The MedTPE project"
CONTACT = "https://github.com/JasonZuu/MedTPE (method); this deployment's operator"
RELEASE_STAGE = "Research use; not validated for clinical decisions"
METRICS = ("auroc", "auprc", "f1", "brier", "ece")
"""The clinical figures an evaluation entry keeps (each with its 95 % interval)."""

INTENDED_USE = (
    "Scores a patient's structured record (MEDS events, or FHIR R4 resources mapped to them) "
    "for the tasks listed below with an open-weights language model, whose prompt is shortened "
    "losslessly by MedTPE token-pair merges. Answers come from `POST /predict`, "
    "`/predict/batch`, a CDS Hooks service (`patient-view`, `encounter-start`, "
    "`encounter-discharge`) or the nightly batch job (`medtpe predict`), which can write each "
    "answer back to the EHR as a FHIR RiskAssessment with its Provenance. Every answer is kept "
    "in the prediction ledger with a signed receipt that re-derives it."
)
USERS = (
    "Health-system data science and clinical informatics teams who validate a model on their own "
    "patients before any output reaches a clinician; researchers measuring prompt compression."
)
HOW_TO_USE = (
    "Validate a model that discriminates on your own patients (`medtpe evaluate`), set the risk "
    "bands per task, then serve it (`medtpe serve`) or run it nightly (`medtpe predict`). "
    "Check `/readyz`: the input budget must be one the artefact was validated at."
)
OUT_OF_SCOPE = (
    "Any clinical decision with the default model; unsupervised use; free-text notes, images "
    "or signals (not read); records of a coding the site mapping does not describe; input "
    "budgets above the artefact's validated ones."
)
KNOWN_RISKS = (
    "- Only the tasks with figures under KeyMetrics were evaluated end to end; the others have "
    "no clinical figure.\n"
    '- MedTPE moves p("yes") a little against the same model without it (the fidelity '
    "gate's figures, SafetyReliability).\n"
    "- The probability is the first answer token's, not a calibrated risk.\n"
    "- Records longer than the input budget lose their oldest events."
)
BIASES = (
    "Built and evaluated on the 100 patients of the MIMIC-IV Clinical Database Demo (63 with "
    "ICU stays; one US academic centre, 2008-2019): too few to measure performance by sex, age, "
    "race or insurance, and none was measured. The base model's pretraining data is web text "
    "with its own biases."
)
MAINTENANCE = (
    "Every prediction is kept in the ledger (door, caller, task, answer, p, receipt), which is "
    "what monitoring reads. An artefact is rebuilt when the base model, the merges, the code "
    "descriptions or the renderer change; its manifest's digest makes a stale artefact fail "
    "the service's start."
)
SECURITY = (
    "Runs inside the hospital's network: no record leaves it. API keys or the EHR's signed JWT "
    "(CDS Hooks); SMART Backend Services to the FHIR server, the token only to its origin. "
    "Receipts are signed by the service."
)
TRANSPARENCY = (
    "Open weights, open code, an open artefact (merges, rows, manifest, build report); every "
    "answer carries a receipt (digests of the record, prompt, artefact and decoding settings) "
    "that `medtpe verify` re-derives."
)
CONSENT = (
    "Patients are not asked by the product; disclosure of AI-produced risk scores follows the "
    "deploying organisation's policy. Written-back resources carry the AIAST security label."
)
BIBLIOGRAPHY = (
    "@misc{medtpe, title={MedTPE: lossless token-pair encoding for medical records}, "
    "howpublished={https://github.com/JasonZuu/MedTPE}}\n"
    "@misc{mimicivdemo, title={MIMIC-IV Clinical Database Demo}, author={Johnson, A. and "
    "Bulgarelli, L. and Pollard, T. and Horng, S. and Celi, L. A. and Mark, R.}, "
    "publisher={PhysioNet}, doi={10.13026/07hj-2a80}}"
)


def product_version() -> str:
    """The installed product's version (`0+unknown` when run from a tree not installed)."""
    try:
        return metadata.version("medtpe")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _interval(figure: Mapping[str, Any], unit: str | None = None) -> str:
    """A bootstrap figure ({value, low, high}) as CHAI's `ValueJson` (`estimate_ci`, 95 %)."""
    value: dict[str, Any] = {
        "kind": "estimate_ci",
        "estimate": round(float(figure["value"]), 4),
        "lower": round(float(figure["low"]), 4),
        "upper": round(float(figure["high"]), 4),
        "level": 95,
    }
    if unit:
        value["unit"] = unit
    return json.dumps(value, separators=(",", ":"))


def _single(value: float | int, unit: str | None = None) -> str:
    data: dict[str, Any] = {"kind": "single", "value": value}
    if unit:
        data["unit"] = unit
    return json.dumps(data, separators=(",", ":"))


def evaluation_report(results: Mapping[str, Any], date: str, source: str) -> dict[str, Any]:
    """One entry of an artefact's evaluation report from a stored `medtpe evaluate` run (its
    rescored results: `medtpe rescore`): the task, records, subjects and positives, the budget,
    the artefact evaluated, and each mode's figures with their 95 % intervals; `date` (ISO) is
    when the run was made, `source` the results file's path."""
    settings = results["settings"]
    modes = {
        mode: {
            name: {k: results[mode][name][k] for k in ("value", "low", "high")}
            for name in METRICS
            if name in results[mode]
        }
        for mode in ("original", "medtpe")
        if mode in results
    }
    first = results.get("original") or results["medtpe"]
    return {
        "task": settings["task"],
        "date": date,
        "source": source,
        "n_records": first["n_records"],
        "n_subjects": first["n_subjects"],
        "n_positive": first["n_positive"],
        "max_input_tokens": settings["max_input_tokens"],
        "artefact_id": settings["models"]["medtpe"]["artefact_id"],
        "same_answer": results.get("agreement"),
        "modes": modes,
    }


def write_evaluation_report(
    artefact_dir: Path, artefact_date: str, runs: Sequence[tuple[Path, str]]
) -> Path:
    """Write `artefact_dir/evaluation_report.json`: the artefact's build date and an entry
    (`evaluation_report`) for each (rescored results file, ISO date of the run) of `runs`."""
    report = {
        "artefact_date": artefact_date,
        "evaluations": [
            evaluation_report(_read_json(Path(path)) or {}, date, Path(path).as_posix())
            for path, date in runs
        ],
    }
    target = Path(artefact_dir) / EVALUATION_FILE
    target.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return target


def _usefulness(evaluations: Sequence[Mapping[str, Any]], build: Mapping[str, Any] | None):
    results = []
    for entry in evaluations:
        for mode, figures in entry["modes"].items():
            for name in ("auroc", "auprc"):
                if name in figures:
                    evaluated = f", artefact {entry['artefact_id']}" if mode == "medtpe" else ""
                    label = (
                        f"{entry['task']} {name.upper()}, {mode}{evaluated} "
                        f"({entry['n_records']} stays, {entry['date']})"
                    )
                    results.append({"Label": label, "ValueJson": _interval(figures[name])})
    compression = ((build or {}).get("measure") or {}).get("compression")
    if compression:
        results.append(
            {
                "Label": f"prompt tokens saved ({compression['n_records']} validation windows)",
                "ValueJson": _single(round(100 * compression["prompt_compression_rate"], 1), "%"),
            }
        )
    described = "; ".join(
        f"{e['task']}: {e['n_records']} records of {e['n_subjects']} patients "
        f"({e['n_positive']} positive), {e['max_input_tokens']} input tokens, artefact "
        f"{e['artefact_id']}, run {e['date']} ({e['source']})"
        for e in evaluations
    )
    return {
        "MetricGoal": "Discrimination of the outcome (AUROC, AUPRC) and prompt compression.",
        "Results": {"MetricResult": results or [_no_figure("clinical evaluation")]},
        "Interpretation": (
            "AUROC near 0.5 means no discrimination: the default model has none. The "
            "compression says how many fewer tokens the model reads, not whether it is right."
        ),
        "TestType": "Retrospective, internal (the same demo database the artefact was built on).",
        "TestingDataDescription": described or "No clinical evaluation is recorded.",
        "ValidationProcessAndJustification": (
            "`medtpe evaluate` then `medtpe rescore`: 95 % intervals of 1,000 patient "
            "resamples; meds-evaluation scores the same predictions files."
        ),
    }


def discrimination_risks(model_name: str, evaluations: Sequence[Mapping[str, Any]]) -> list[str]:
    """A known risk for each evaluation whose AUROC's 95 % interval reaches down to 0.5 (not
    shown better than chance), per mode, with its records and date."""
    risks = []
    for entry in evaluations:
        for mode, figures in entry["modes"].items():
            auroc = figures.get("auroc")
            if auroc and auroc["low"] <= 0.5:
                risks.append(
                    f"- **{model_name} does not discriminate {entry['task']}** ({mode} mode): "
                    f"AUROC {auroc['value']:.2f} [{auroc['low']:.2f}, {auroc['high']:.2f}] on "
                    f"{entry['n_records']} records of {entry['n_subjects']} patients "
                    f"({entry['n_positive']} positive), {entry['date']}. Do not act on its "
                    "answers."
                )
    return risks


def _no_figure(what: str) -> dict[str, str]:
    return {"Label": f"{what}: none measured", "ValueJson": _single(0, "figures")}


def _safety(bundle: ArtefactBundle, built: str):
    results = []
    for budget, figures in sorted(bundle.validated.items()):
        n = figures.get("n_records")
        if "same_answer" in figures:
            results.append(
                {
                    "Label": f"same answer as the model without MedTPE, {budget} tokens ({n} "
                    f"held-out windows, {built})",
                    "ValueJson": _interval(figures["same_answer"]),
                }
            )
        if "delta_p_mean" in figures:
            results.append(
                {
                    "Label": f"mean |Δp(yes)| against the model without MedTPE, {budget} tokens "
                    f"({figures.get('delta_p_n', n)} answered windows, {built})",
                    "ValueJson": _interval(figures["delta_p_mean"]),
                }
            )
    return {
        "MetricGoal": 'MedTPE must not change the model\'s answer: same answer and p("yes").',
        "Results": {"MetricResult": results or [_no_figure("fidelity gate")]},
        "Interpretation": (
            "The build's fidelity gate: held-out windows through both models (float32); an "
            "artefact is written only when it passes. It says how far MedTPE moves the model, "
            "never whether the model is clinically right."
        ),
        "TestType": "Paired comparison on held-out patients (never trained on).",
        "TestingDataDescription": (
            f"The gate windows of artefact {bundle.artefact_id}'s held-out patients, at "
            f"{', '.join(map(str, bundle.validated_budgets)) or 'no'} input tokens."
        ),
        "ValidationProcessAndJustification": (
            "`medtpe build-artefact`'s gate (medtpe/training/fidelity_gate.py); bootstrap 95 % "
            "intervals; figures in the artefact's manifest.json."
        ),
    }


def _fairness():
    return {
        "MetricGoal": "Equal performance across patient groups.",
        "Results": {"MetricResult": [_no_figure("subgroup performance")]},
        "Interpretation": "Not measured: the demo's patients are too few for any subgroup.",
        "TestType": "None.",
        "TestingDataDescription": "None.",
        "ValidationProcessAndJustification": (
            "A deployment measures it on its own patients (the ledger's rows by cohort)."
        ),
    }


def _development_data(build: Mapping[str, Any] | None) -> str:
    if not build:
        return "No build report is shipped with the artefact."
    split = build.get("split") or {}
    settings = build.get("settings") or {}
    return (
        f"MIMIC-IV Clinical Database Demo in MEDS ({split.get('split_source', 'split unknown')}"
        f"); tasks {', '.join(settings.get('tasks', []))}; {split.get('n_train_windows')} "
        f"training, {split.get('n_val_windows')} validation and {split.get('n_gate_windows')} "
        f"gate windows; {len(build.get('held_out_subjects') or [])} patients held out."
    )


def _release_info(bundle: ArtefactBundle, version: str, built: str) -> dict[str, Any]:
    """The card's `ReleaseInfo`: the stage, the artefact's date and the versions."""
    return {
        "ReleaseStage": RELEASE_STAGE,
        "ReleaseDate": built,
        "ReleaseVersion": f"medtpe {version}, artefact {bundle.artefact_id}",
        "GlobalAvailability": "Open source; self-hosted by each deploying organisation.",
        "EHRCompatibility": {"EHR": ["FHIR R4 (Bundles, Bulk Data export)", "CDS Hooks 2.0"]},
        "RegulatoryApproval": "None. Not a medical device; not cleared or approved.",
    }


def _uses_and_directions() -> dict[str, Any]:
    """The card's `UsesAndDirections`: the intended use, users and population."""
    return {
        "IntendedUseAndWorkflow": INTENDED_USE,
        "PrimaryIntendedUsers": USERS,
        "HowToUse": HOW_TO_USE,
        "TargetedPatientPopulation": (
            "Adult hospital and ICU patients whose records the site mapping reads; the "
            "artefact was built on ICU stays."
        ),
        "CautionedOutOfScopeSettings": OUT_OF_SCOPE,
    }


def _warnings(
    model_name: str,
    mode: str,
    max_input_tokens: int,
    evaluations: Sequence[Mapping[str, Any]],
    validated: bool,
) -> dict[str, Any]:
    """The card's `Warnings`: the measured discrimination, the known risks (and a budget served
    above the validated ones, in MedTPE mode), the biases and the risk level."""
    return {
        "KnownRisksAndLimitations": "\n".join(
            [*discrimination_risks(model_name, evaluations), KNOWN_RISKS]
        )
        + (
            ""
            if validated or mode != "medtpe"
            else f"\n- This service's input budget ({max_input_tokens} tokens) is above "
            "the budgets the artefact was validated at."
        ),
        "KnownBiasesOrEthicalConsiderations": BIASES,
        "ClinicalRiskLevel": "High if acted on: the default model's answers are not right.",
    }


def _trust_ingredients(
    model_name: str, task_lines: str, build: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The card's `TrustIngredients`: the AI system's facts and the transparency information."""
    return {
        "AISystemFacts": {
            "OutcomesAndOutputs": (
                'Per task: the answer (yes/no, an option, or options) and p("yes") from '
                "the first answer token, with a prediction id and a signed receipt.\n" + task_lines
            ),
            "ModelType": "Decoder-only transformer language model, prompted (no fine-tune "
            "of its weights); MedTPE adds token-pair embedding rows.",
            "FoundationModels": model_name,
            "InputDataSource": "The deploying site's EHR: MEDS events or FHIR R4 resources "
            "(Patient, Encounter, Observation, Condition, Medication*, Procedure).",
            "OutputAndInputDataTypes": "Input: structured events (codes, values, times). "
            "Output: JSON answer, probability; FHIR RiskAssessment on write-back.",
            "DevelopmentDataCharacterization": _development_data(build),
            "BiasMitigationApproaches": "None beyond holding patients out of training; "
            "none measured.",
            "OngoingMaintenance": MAINTENANCE,
            "Security": SECURITY,
            "Transparency": TRANSPARENCY,
        },
        "TransparencyInformation": {
            "FundingSource": "Not recorded.",
            "ThirdPartyInformation": "Base model: SmolLM2 (Hugging Face, Apache-2.0); data: "
            "MIMIC-IV demo (PhysioNet, ODbL).",
            "StakeholdersConsulted": "None recorded.",
        },
    }


def _facts(
    bundle: ArtefactBundle,
    *,
    model_name: str,
    mode: str,
    version: str,
    max_input_tokens: int,
    validated: bool,
    tasks: Sequence[Task],
    evaluations: list[Any],
) -> dict[str, Any]:
    """The card's machine-readable `facts`: what the served model is, the budgets, the tasks,
    the evaluations and the files the card was made from (with their sha256)."""
    sources = [
        {"file": name, "sha256": _sha256(bundle.path / name)}
        for name in ("manifest.json", BUILD_REPORT_FILE, EVALUATION_FILE)
        if (bundle.path / name).is_file()
    ]
    return {
        "model": model_name,
        "mode": mode,
        "product_version": version,
        "artefact_id": bundle.artefact_id,
        "base_fingerprint": bundle.base_fingerprint,
        "content_digest": bundle.digest(),
        "max_input_tokens": max_input_tokens,
        "validated_budgets": list(bundle.validated_budgets),
        "budget_validated": validated,
        "validated": {str(b): dict(f) for b, f in sorted(bundle.validated.items())},
        "rendering": None if bundle.rendering is None else bundle.rendering.to_json(),
        "tasks": [
            {"name": t.name, "title": t.title, "question": t.question, "type": t.label_type}
            for t in tasks
        ],
        "evaluations": evaluations,
        "sources": sources,
    }


def build_model_card(
    bundle: ArtefactBundle,
    *,
    model_name: str,
    mode: str,
    max_input_tokens: int,
    tasks: Sequence[Task],
    card_url: str | None = None,
) -> dict[str, Any]:
    """The model card of a served model: `bundle` (its manifest, build and evaluation reports
    beside it), the model's name and mode (`medtpe` or `original`), the input budget served,
    the tasks served and where the card is published (see the module docstring)."""
    build = _read_json(bundle.path / BUILD_REPORT_FILE)
    evaluation = _read_json(bundle.path / EVALUATION_FILE) or {}
    evaluations = list(evaluation.get("evaluations") or [])
    built = evaluation.get("artefact_date") or "date not recorded"
    version = product_version()
    task_lines = "\n".join(f"- {t.title} ({t.name}): {t.question}" for t in tasks)
    budgets = bundle.validated_budgets
    validated = bool(budgets) and max_input_tokens <= budgets[-1]
    card = {
        "BasicInfo": {
            "ModelName": f"MedTPE · {model_name} ({mode})",
            "ModelDeveloper": DEVELOPER,
            "DeveloperContact": CONTACT,
        },
        "ReleaseInfo": _release_info(bundle, version, built),
        "ModelSummary": {
            "Summary": (
                f"{model_name} answering clinical prediction questions from a patient's "
                f"structured record ({mode} mode; up to {max_input_tokens} input tokens). "
                "Tasks:\n" + task_lines
            ),
            "Keywords": {"Keyword": ["risk prediction", "EHR", "MEDS", "FHIR", "LLM", "MedTPE"]},
        },
        "UsesAndDirections": _uses_and_directions(),
        "Warnings": _warnings(model_name, mode, max_input_tokens, evaluations, validated),
        "TrustIngredients": _trust_ingredients(model_name, task_lines, build),
        "KeyMetrics": {
            "UsefulnessUsabilityEfficacy": _usefulness(evaluations, build),
            "FairnessEquity": _fairness(),
            "SafetyReliability": _safety(bundle, built),
        },
        "Resources": {
            "EvaluationReferences": "docs/benchmarks.md (Evaluation: clinical metrics; "
            "Fidelity); the artefact's README.md, manifest.json and build_report.json.",
            "PeerReviewedPublications": "None for this build.",
            "PatientConsentOrDisclosure": CONSENT,
        },
        "Bibliography": BIBLIOGRAPHY,
    }
    facts = _facts(
        bundle,
        model_name=model_name,
        mode=mode,
        version=version,
        max_input_tokens=max_input_tokens,
        validated=validated,
        tasks=tasks,
        evaluations=evaluations,
    )
    return {
        "format": CHAI_FORMAT,
        "schema": CHAI_NAMESPACE,
        "url": card_url,
        "card": card,
        "facts": facts,
    }


def card_digest(card: Mapping[str, Any]) -> str:
    """sha256 of the card's canonical JSON (sorted keys, compact): its identity."""
    canonical = json.dumps(card, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
