"""MedTPE: clinical predictions with open LLMs on long patient records, the prompt losslessly
compressed by the MedTPE tokenizer; the offline build, the service, the batch job and the
`medtpe` command, in one import root.

Each subpackage is a layer (docs/architecture.md, "Layers"), importing only the layers below it:
`core` (pure Python, no torch), `inference` (the Predictor and the engines), `ledger`,
`model_card`, `fhir_resources`, `evaluation`, then `service`, `batch`, `monitoring` and
`training`, and `cli` (the `medtpe` command) above all. Each package's `__all__` names what other
packages may import from it; importing a package loads none of its modules.
"""

__all__ = [
    "batch",
    "cli",
    "core",
    "evaluation",
    "fhir_resources",
    "inference",
    "ledger",
    "model_card",
    "monitoring",
    "service",
    "training",
]
