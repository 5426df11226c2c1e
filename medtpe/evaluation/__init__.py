"""The evaluation (`medtpe evaluate`): a task's labelled records (`records`) run through the
service's engine and pipeline, original vs MedTPE (`runner`), one result per record and mode
(`record_result`), aggregated into the report's figures (`figures`), written as meds-evaluation
predictions (`predictions`); stored reports read back, compared and re-scored (`stored_report`).
The build's fidelity gate answers through the runner."""

__all__ = ["figures", "predictions", "record_result", "records", "runner", "stored_report"]
