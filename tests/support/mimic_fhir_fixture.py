"""The MIMIC-IV demo fixture of the FHIR round trip (tests/fixtures/fhir/mimic-demo-stays/): a
few ICU stays of the shared MIMIC-IV demo MEDS data, small enough to commit (ODbL 1.0, the
attribution in its README). Made by

    .venv/bin/python -m tests.support.mimic_fhir_fixture --meds ../shared/data/mimic-iv-demo-meds \\
        --out tests/fixtures/fhir/mimic-demo-stays

Each stay keeps, up to its ICU-mortality prediction time, every event of its last
`RECENT_HOURS` hours and every event of the other kinds (admissions, diagnoses, procedures, ...)
of the subject's history, so all the converter's resource kinds occur.
"""

from __future__ import annotations

import argparse
import shutil
from datetime import timedelta
from pathlib import Path

import meds
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset, read_labels
from tests.support.bulk_server import resources_by_type, write_export

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fhir" / "mimic-demo-stays"
"""The committed fixture (a MEDS dataset directory with its ICU-mortality labels)."""
RECENT_HOURS = 6
FREQUENT = ("LAB//", "INFUSION_", "SUBJECT_", "MEDICATION//")
"""Code prefixes kept only in the recent hours (they make up nearly all events)."""
STAYS = 3


def fixture_bundles() -> list[dict]:
    """The fixture's stays as FHIR bundles, one per subject."""
    dataset = MedsDataset.load(FIXTURE)
    return [fhir_bundle_from_meds(dataset.events(s)) for s in dataset.subject_ids]


def fixture_export(out: Path, bundles: list[dict] | None = None, files_per_type: int = 2) -> Path:
    """`bundles` (default: `fixture_bundles()`) as a FHIR bulk export in `out`."""
    bundles = fixture_bundles() if bundles is None else bundles
    return write_export(resources_by_type(bundles), out, files_per_type=files_per_type)


def make(meds_root: Path, out: Path, n_stays: int = STAYS) -> None:
    """Write the fixture from the MEDS dataset `meds_root` (its first `n_stays` labelled stays
    of distinct subjects)."""
    labels = read_labels(meds_root / "labels" / "icu_mortality.parquet")
    chosen, subjects = [], set()
    for point in labels:
        if point.subject_id not in subjects:
            chosen.append(point)
            subjects.add(point.subject_id)
        if len(chosen) == n_stays:
            break
    events = pq.read_table(meds_root / "data" / "events.parquet")
    parts = []
    for point in chosen:
        own = events.filter(pc.equal(events["subject_id"], point.subject_id))
        time = own["time"]
        before = pc.or_kleene(pc.is_null(time), pc.less_equal(time, point.prediction_time))
        recent = pc.greater_equal(time, point.prediction_time - timedelta(hours=RECENT_HOURS))
        frequent = pc.or_kleene(*[pc.starts_with(own["code"], prefix) for prefix in FREQUENT[:2]])
        for prefix in FREQUENT[2:]:
            frequent = pc.or_kleene(frequent, pc.starts_with(own["code"], prefix))
        keep = pc.and_kleene(before, pc.or_kleene(pc.invert(frequent), pc.fill_null(recent, True)))
        parts.append(own.filter(keep))
    kept = pa.concat_tables(parts)
    codes = pq.read_table(meds_root / meds.code_metadata_filepath)
    codes = codes.filter(pc.is_in(codes["code"], value_set=pc.unique(kept["code"])))
    for sub in ("data", "metadata", "labels"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    pq.write_table(kept, out / "data" / "events.parquet")
    pq.write_table(codes, out / meds.code_metadata_filepath)
    rows = {
        "subject_id": [p.subject_id for p in chosen],
        "prediction_time": [p.prediction_time for p in chosen],
        "boolean_value": [p.label for p in chosen],
    }
    pq.write_table(pa.table(rows), out / "labels" / "icu_mortality.parquet")
    shutil.copy(meds_root / "LICENSE.txt", out / "LICENSE.txt")


def main() -> None:
    """Write the fixture (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args()
    make(args.meds, args.out)


if __name__ == "__main__":
    main()
