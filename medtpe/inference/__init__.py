"""The inference path shared by the service, the evaluation and the benchmarks: model loading
(`medtpe.inference.model`), prompt → ids → engine → parsed answer (`medtpe.inference.predictor`) and
the engine behind one interface (`medtpe.inference.engines.protocol`). No HTTP here."""
