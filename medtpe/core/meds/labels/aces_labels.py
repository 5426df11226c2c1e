"""Labels from an ACES task configuration (the `es-aces` package, imported on use): the
configuration's cohort over every data shard of a MEDS dataset, as a MEDS label table.

`ACES_CONFIG_DIR` holds configurations of built-in tasks (`icu_mortality.yaml`).
"""

from __future__ import annotations

from pathlib import Path

import meds
import pyarrow as pa
from tqdm import tqdm

ACES_CONFIG_DIR = Path(__file__).resolve().parent / "aces"
ACES_COLUMNS = {
    "subject_id": meds.LabelSchema.subject_id_name,
    "index_timestamp": meds.LabelSchema.prediction_time_name,
    "label": meds.LabelSchema.boolean_value_name,
}
"""ACES output columns and their MEDS label names (as `aces-cli data.standard=meds` renames)."""


class AcesUnavailable(RuntimeError):
    """The `es-aces` package is not installed."""


def aces_labels(config_path: Path, meds_dir: Path) -> pa.Table:
    """The ACES cohort of `config_path` over `meds_dir/data/**/*.parquet` (one shard at a time),
    as a `meds.LabelSchema` table."""
    try:
        from aces import config, predicates, query
        from omegaconf import OmegaConf
    except ModuleNotFoundError as exc:
        raise AcesUnavailable(
            "ACES configurations need the es-aces package (pip install 'medtpe[labels]')"
        ) from exc
    task_config = config.TaskExtractorConfig.load(config_path=config_path)
    shards = sorted((meds_dir / meds.data_subdirectory).glob("**/*.parquet"))
    tables = []
    for shard in tqdm(shards, desc="ACES", unit="shard"):
        data_config = OmegaConf.create({"path": str(shard), "standard": "meds"})
        result = query.query(task_config, predicates.get_predicates_df(task_config, data_config))
        if len(result):
            columns = result.select(list(ACES_COLUMNS)).rename(ACES_COLUMNS)
            tables.append(columns.to_arrow())
    if not tables:
        empty = {name: [] for name in ACES_COLUMNS.values()}
        return meds.LabelSchema.align(pa.table(empty))
    table = pa.concat_tables([meds.LabelSchema.align(t) for t in tables])
    return table.sort_by(
        [
            (meds.LabelSchema.subject_id_name, "ascending"),
            (meds.LabelSchema.prediction_time_name, "ascending"),
        ]
    )
