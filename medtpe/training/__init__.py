"""The training layer (torch and transformers, imported by the modules that train): a MedTPE
artefact built from a Hugging Face causal LM and a MEDS dataset (`build_artefact`, its settings
`build_config`, its report `build_report`, its resumable state `build_state`, the base model's
requirements `base_model`), the new embedding rows trained by SSFT (`ssft`, `ssft_pipeline`; the
losses by name in `loss_names`), the export the engine serves (`export`), the default model
(`default_model`) and the "without replacement" ablation (`without_replacement`)."""

__all__ = [
    "base_model",
    "build_artefact",
    "build_config",
    "build_report",
    "build_state",
    "default_model",
    "export",
    "loss_names",
    "ssft",
    "ssft_pipeline",
    "without_replacement",
]
