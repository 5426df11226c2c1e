"""Synthetic hospital FHIR R4 data from `clinosim` (PyPI, pinned in the dev extra) as one
searchset Bundle per patient (`medtpe.batch.fhir_export`): the FHIR data no one here wrote, for
the mapping tests.

The committed fixture (tests/fixtures/fhir/clinosim/) was made by

    .venv/bin/python -m tests.support.clinosim_bundles --population 20 --seed 42 --patients 4 \\
        --out tests/fixtures/fhir/clinosim

(clinosim runs offline; 20 patients take about 16 s on the development box).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from medtpe.batch.fhir_export import patient_bundles


def simulate(population: int, seed: int, out: Path) -> Path:
    """Run the clinosim CLI (US cohort, FHIR R4 NDJSON); the NDJSON directory."""
    clinosim = Path(sys.executable).with_name("clinosim")
    command = [str(clinosim), "simulate", "--country", "US", "--population", str(population)]
    command += ["--seed", str(seed), "--output", str(out), "--format", "fhir-r4"]
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    return out / "fhir_r4"


def _types(bundle: dict[str, Any]) -> set[str]:
    return {entry["resource"]["resourceType"] for entry in bundle["entry"]}


def covering(bundles: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """At most `n` Bundles, smallest first, each adding resource types the ones before lack:
    the widest coverage in a small fixture."""
    chosen: list[dict[str, Any]] = []
    seen: set[str] = set()
    for bundle in sorted(bundles, key=lambda b: len(json.dumps(b))):
        if len(chosen) < n and not _types(bundle) <= seen:
            chosen.append(bundle)
            seen |= _types(bundle)
    return chosen


def main() -> None:
    """Write `--patients` per-patient Bundles of a fresh clinosim cohort into `--out`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--population", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--patients", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        bundles = list(patient_bundles(simulate(args.population, args.seed, Path(scratch))))
    for i, bundle in enumerate(covering(bundles, args.patients)):
        path = args.out / f"patient-{i}.json.gz"
        # mtime=0: the same cohort gives the same bytes
        with gzip.GzipFile(path, "wb", mtime=0) as out:
            out.write(json.dumps(bundle, separators=(",", ":")).encode())


def read_bundles(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, Bundle) of each `*.json.gz` Bundle in `directory`, sorted by name."""
    return [
        (path.name, json.loads(gzip.decompress(path.read_bytes())))
        for path in sorted(directory.glob("*.json.gz"))
    ]


if __name__ == "__main__":
    main()
