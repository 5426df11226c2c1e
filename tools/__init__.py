"""Tools beside the product, not shipped: benchmarks (`tools/benchmarks`), research workbenches
(`tools/research`) and scripts (`tools/scripts`), each run as a module from the repository root
(`.venv/bin/python -m tools.benchmarks.NAME`). They may import any module of every layer of
`medtpe`; nothing outside `tools/` and its tests (`tests/tools/`) imports them."""
