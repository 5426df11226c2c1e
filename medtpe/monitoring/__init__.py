"""Watching the model in production: outcomes joined to the ledger's predictions by the task's
own labeller (`medtpe.monitoring.outcomes`), each prediction's cohort (`medtpe.monitoring.cohort`),
and the monitoring report (`medtpe.monitoring.report`, its figures per slice in
`medtpe.monitoring.figures`, its rows read in `medtpe.monitoring.frame`): performance,
calibration, flag rates, overrides and latency by week, site and subgroup, as HTML, JSON and a
seismometer export.

It reads and writes the ledger (`ledger`) and uses the core (`medtpe.core`); it imports neither
the engine nor the service nor the batch job."""

__all__ = ["cohort", "figures", "frame", "outcomes", "report"]
