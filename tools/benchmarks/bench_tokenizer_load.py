"""What an engine start pays for the MedTPE tokenizer: loading an export or artefact directory
as vLLM does (`medtpe.inference.vllm_tokenizer.load_medtpe_tokenizer`) and vLLM's deep copy of it
for its tokenizer pool, median of `--repeats` in this process; each copy is checked to encode and
decode as the original.

    .venv/bin/python -m tools.benchmarks.bench_tokenizer_load DIR [DIR ...] [--repeats 3] [--out
    FILE]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

from medtpe.inference.vllm_tokenizer import load_medtpe_tokenizer
from tools.benchmarks.results_file import write_results

TEXT = "Heart Rate: 88 bpm\nNon Invasive Blood Pressure mean: 92 mmHg, température 😀\n" * 20


def measure(path: Path, repeats: int) -> dict[str, float | int]:
    """Median seconds of a load and of a deep copy of the tokenizer in `path`."""
    loads, copies = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tokenizer = load_medtpe_tokenizer(path)
        loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        clone = copy.deepcopy(tokenizer)
        copies.append(time.perf_counter() - start)
        ids = tokenizer.encode(TEXT)
        assert clone.encode(TEXT) == ids and clone.decode(ids) == tokenizer.decode(ids)
    return {
        "vocab_size": len(tokenizer),
        "load_s": round(statistics.median(loads), 3),
        "deepcopy_s": round(statistics.median(copies), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", type=Path, nargs="+", help="MedTPE export or artefact dirs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    args = parser.parse_args()
    results = {str(d): measure(d, args.repeats) for d in args.dirs}
    for path, row in results.items():
        print(f"{path}: {row}")
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
