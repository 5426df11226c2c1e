"""Run with the seismometer venv's Python (`tools/scripts/seismometer_venv.py`), not the project's:
load a monitoring export folder with seismometer's own loading code (`ConfigProvider`,
`loader_factory(...).load_data()`, as `seismometer.run_startup` does) and print, as JSON, what it
loaded: rows, columns, the target's values and the score's sum. `run_startup` is seismometer's
entry point: its loader (`loader_factory(config).load_data()`) merges the events onto the
predictions, then the usage configuration's load-time filters apply."""

from __future__ import annotations

import json
import sys


def main(folder: str) -> None:
    """Load the export in `folder` and print the summary line."""
    import seismometer
    from seismometer.seismogram import Seismogram

    seismometer.run_startup(config_path=folder, reset=True)
    loaded = Seismogram()
    config, frame = loaded.config, loaded.dataframe
    target = f"{config.target}_Value"
    print(
        json.dumps(
            {
                "seismometer": seismometer.__version__,
                "rows": len(frame),
                "columns": sorted(map(str, frame.columns)),
                "entity_keys": config.entity_keys,
                "target": target,
                "target_counts": {
                    str(k): int(v) for k, v in frame[target].value_counts(dropna=False).items()
                },
                "score_sum": float(frame[config.output].sum()),
                "context_ids": sorted(map(str, frame[config.context_id])),
                "cohorts": sorted(c.source for c in config.cohorts),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
