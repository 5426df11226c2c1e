"""`medtpe outcomes` (from MEDS and from a FHIR Bulk export through the site mapping) and
`medtpe monitor` from the command line; bad options are usage errors naming the option."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from medtpe.cli.monitor_commands import monitor, outcomes
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds.readers import MedsDataset
from medtpe.ledger.store import Ledger
from tests.monitoring.test_outcomes import MADE
from tests.support.meds_outcomes import AT_24H, write_outcome_dataset
from tests.support.monitor_commands import invoke
from tests.support.monitoring_rows import prediction

EXPECTED = {"known": 3, "open": 1, "not_in_data": 1}


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    """A SQLite ledger with one prediction at 24 h for subjects 1, 2, 3, 5 and 77."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    ledger = Ledger.open(url)
    ledger.record(
        [
            prediction(s, created_at=MADE, subject_id=str(s), prediction_time=AT_24H, p_yes=0.3)
            for s in (1, 2, 3, 5, 77)
        ]
    )
    ledger.close()
    return url


def _bulk_export(meds_dir: Path, out: Path) -> Path:
    """The dataset's subjects as a FHIR Bulk Data export (one NDJSON file per resource type)."""
    dataset = MedsDataset.load(meds_dir)
    by_type: dict[str, list[str]] = defaultdict(list)
    for subject in dataset.subject_ids:
        for entry in fhir_bundle_from_meds(dataset.events(subject))["entry"]:
            resource = entry["resource"]
            by_type[resource["resourceType"]].append(json.dumps(resource))
    out.mkdir(parents=True)
    for kind, lines in by_type.items():
        (out / f"{kind}.ndjson").write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("source", ["meds", "fhir"])
def test_outcomes_then_monitor(ledger_url: str, tmp_path: Path, source: str) -> None:
    meds_dir = write_outcome_dataset(tmp_path / "meds")
    given = ["--meds", str(meds_dir)]
    if source == "fhir":
        given = ["--fhir", str(_bulk_export(meds_dir, tmp_path / "export"))]
    code, output = invoke(outcomes, "--ledger", ledger_url, "--task", "icu_mortality", *given)
    assert code == 0, output
    counts = json.loads(output.strip().splitlines()[-1])
    assert (counts["statuses"], counts["positives"]) == (EXPECTED, 1)
    assert counts["data_end"] == "2150-03-05T08:00:00"

    out = tmp_path / "report"
    code, output = invoke(monitor, "--ledger", ledger_url, "--out", str(out), "--resamples", "10")
    assert code == 0, output
    assert "icu_mortality: 5 live predictions." in output
    report = json.loads((out / "report.json").read_text())
    assert report["tasks"][0]["overall"]["outcomes"]["known"] == 3
    assert (out / "report.html").is_file()
    assert (out / "seismometer" / "icu_mortality" / "usage_config.yml").is_file()


@pytest.mark.parametrize(
    ("args", "files", "named"),
    [
        (["outcomes", "--task", "icu_mortality"], {}, "either --meds or --fhir"),
        (["outcomes", "--task", "phenotyping", "--meds", "{meds}"], {}, "--task"),
        (
            ["outcomes", "--task", "icu_mortality", "--meds", "{meds}", "--attributes", "{a}"],
            {"a": "race: WHITE\n"},
            "--attributes",
        ),
        (
            ["monitor", "--out", "{out}", "--thresholds", "{t}"],
            {"t": "default: 2\n"},
            "--thresholds",
        ),
        (
            ["monitor", "--out", "{out}", "--since", "2026-11-02", "--until", "2026-11-01"],
            {},
            "--until",
        ),
        (["monitor", "--out", "{out}", "--resamples", "100000"], {}, "--resamples"),
    ],
)
def test_bad_options_are_usage_errors(
    ledger_url: str, tmp_path: Path, args: list[str], files: dict[str, str], named: str
) -> None:
    paths = {"meds": str(write_outcome_dataset(tmp_path / "meds")), "out": str(tmp_path / "o")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        paths[name] = str(tmp_path / name)
    command = {"outcomes": outcomes, "monitor": monitor}[args[0]]
    code, output = invoke(command, "--ledger", ledger_url, *(a.format(**paths) for a in args[1:]))
    assert code == 2, output
    assert named in output
