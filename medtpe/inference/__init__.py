"""The inference path shared by the service, the batch job, the evaluation and the build: model
loading (`model`, its checkpoints' checks in `checkpoints`), the record a prediction is about
(`record`), prompt → ids → engine → parsed answer (`predictor`, decoded with `sampling`'s
settings), what the ledger records of an answer (`receipt_facts`) and of its vocabulary
(`drift`), and the engines behind one interface (`engines`). `vllm_plugin` is vLLM's entry point
(the MedTPE tokenizer inside stock vLLM). No HTTP here."""

__all__ = [
    "checkpoints",
    "drift",
    "engines",
    "model",
    "predictor",
    "receipt_facts",
    "record",
    "sampling",
    "vllm_plugin",
]
