"""`bench_fidelity served`: float32 and served-dtype `diagnose` runs of the same points joined
across files, rows read under another float32 name, and the rounding parts reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_fidelity import main


def _run(path: Path, dtype: str, points: list[tuple[str, int, float, dict[str, float]]]) -> Path:
    """A `diagnose` results file of (key, subject, original p, {variant: p}) at 4,096."""
    records = [
        {
            "key": key,
            "subject_id": subject,
            "p_original": {"yes": p, "no": 1 - p},
            "variants": {name: {"p": {"yes": q, "no": 1 - q}} for name, q in variants.items()},
        }
        for key, subject, p, variants in points
    ]
    body = {"results": {"dtype": dtype, "budgets": {"4096": {"records": records}}}}
    path.write_text(json.dumps(body))
    return path


def test_served_joins_runs_and_reads_rows_under_their_float32_name(tmp_path: Path) -> None:
    exact = [(f"{s}@t{k}", s, 0.8, {"stretch": 0.8}) for s in range(4) for k in range(2)]
    rounded = [
        (f"{s}@t{k}", s, 0.82 if k else 0.79, {"default": 0.6 if k else 0.9})
        for s in range(4)
        for k in range(2)
    ]
    paths = {
        "f32_a": _run(tmp_path / "f32_a.json", "float32", exact[:5]),
        "f32_b": _run(tmp_path / "f32_b.json", "float32", exact[5:]),
        "bf16_a": _run(tmp_path / "bf16_a.json", "bfloat16", rounded[:3]),
        "bf16_b": _run(tmp_path / "bf16_b.json", "bfloat16", rounded[3:]),
    }
    out = tmp_path / "served.json"
    f32, bf16 = (
        [str(paths["f32_a"]), str(paths["f32_b"])],
        [str(paths["bf16_a"]), str(paths["bf16_b"])],
    )
    main(
        [
            "served",
            "--float32",
            *f32,
            "--served",
            *bf16,
            "--rows",
            "default=stretch",
            "--resamples",
            "50",
            "--out",
            str(out),
        ]
    )
    figures = json.loads(out.read_text())["results"]["budgets"]["4096"]
    assert figures["points"] == 8  # both sides' files joined
    assert figures["floor"]["delta_p_mean"]["value"] == pytest.approx((0.01 + 0.02) / 2)
    rows = figures["rows"]["default"]
    assert rows["float32_name"] == "stretch"
    assert rows["delta_p_mean"]["value"] == pytest.approx((0.11 + 0.22) / 2)
    assert rows["to_floor"] == pytest.approx(11.0)
    assert rows["answers_differ"] == {"float32": 0, "bfloat16": 0}
    parts = rows["rounding_parts"]
    assert parts["n"] == 8 and parts["sd"]["rows"] == pytest.approx(0)
    # rows with no float32 error: the served error is all the two roundings
    assert parts["perfect_rows"]["value"] == pytest.approx(rows["delta_p_mean"]["value"])
    _run(paths["bf16_b"], "float32", rounded[3:])
    with pytest.raises(ValueError, match="different dtypes"):
        main(["served", "--float32", *f32, "--served", *bf16])


def _gate(path: Path, readings: list[tuple[float | None, float | None]]) -> Path:
    """A build report whose 4,096 gate answered records with (original p, MedTPE p)."""

    def result(k: int, p: float | None) -> dict:
        return {
            "key": f"{k}@t",
            "label": None,
            "prediction": None if p is None else p >= 0.5,
            "format_ok": True,
            "latency_s": 1.0,
            "generate_s": 1.0,
            "n_tokens": 4000,
            "n_tokens_original": 4000,
            "probabilities": None if p is None else {"yes": p, "no": 1 - p},
        }

    records = [
        {"original": result(k, o), "medtpe": result(k, m)} for k, (o, m) in enumerate(readings)
    ]
    path.write_text(json.dumps({"gate": {"4096": {"records": records}}}))
    return path


def test_rounding_reads_two_gates_of_the_same_windows(tmp_path: Path) -> None:
    """A window without a probability (a phenotype answer) is left out of the parts."""
    exact = _gate(tmp_path / "f32.json", [(0.8, 0.8), (0.7, 0.72), (None, None), (0.9, 0.88)])
    rounded = _gate(tmp_path / "bf16.json", [(0.81, 0.78), (0.7, 0.75), (None, 0.6), (0.9, 0.9)])
    out = tmp_path / "parts.json"
    f32, bf16 = (f"{path}@4096" for path in (exact, rounded))
    modes = [f"{f32}:original", f"{f32}:medtpe", "--served", f"{bf16}:original", f"{bf16}:medtpe"]
    main(["rounding", "--float32", *modes, "--resamples", "20", "--out", str(out)])
    parts = json.loads(out.read_text())["results"]
    assert parts["n"] == 3
    assert parts["floor"]["value"] == pytest.approx(0.01 / 3)
    assert parts["served"]["value"] == pytest.approx((0.03 + 0.05 + 0.0) / 3)
    assert parts["served_against_exact"]["value"] == pytest.approx((0.02 + 0.05 + 0.0) / 3)


def test_pair_reads_each_artefact_against_its_own_original(tmp_path: Path) -> None:
    """`NAME=MEDTPE,ORIGINAL`: each served dtype's MedTPE against that dtype's original."""
    exact = _gate(tmp_path / "f32.json", [(0.8, 0.82), (0.7, 0.7), (0.9, 0.86)])
    rounded = _gate(tmp_path / "bf16.json", [(0.78, 0.82), (0.72, 0.7), (0.9, 0.9)])
    out = tmp_path / "pair.json"
    f32, bf16 = (f"{path}@4096" for path in (exact, rounded))
    artefacts = ["--artefact", f"float32={f32}:medtpe"]
    artefacts += ["--artefact", f"bfloat16={bf16}:medtpe,{bf16}:original"]
    main(
        [
            "pair",
            "--original",
            f"{f32}:original",
            *artefacts,
            "--resamples",
            "20",
            "--out",
            str(out),
        ]
    )
    results = json.loads(out.read_text())["results"]
    fidelity = {name: f["delta_p_mean"]["value"] for name, f in results["fidelity"].items()}
    assert fidelity == pytest.approx({"float32": 0.02, "bfloat16": (0.04 + 0.02 + 0.0) / 3})
    assert results["differences"]["bfloat16 - float32"]["value"] == pytest.approx(0.0)
