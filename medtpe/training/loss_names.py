"""The SSFT losses by name (no torch: the CLI offers them without loading it); what each
computes is in `medtpe.training.losses`."""

LOSSES = ("ce", "kl", "kl_dense")
"""`ce`: cross-entropy to the pseudo-labels; `kl`: distillation at the answer positions;
`kl_dense`: `kl` plus distillation at the prompt's shared ends."""
