"""The inference path shared by the service, the evaluation and the benchmarks: model loading
(`inference.model`), prompt → ids → engine → parsed answer (`inference.predictor`) and the
engine behind one interface (`inference.engine`). No HTTP here."""
