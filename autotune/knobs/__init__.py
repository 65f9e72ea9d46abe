"""Applying the model-side knobs: activation checkpointing, torch.compile, AMP and TF32,
the forced SDPA backend, the gradient scaler, and the rules for what a device can run.

Works on any model whose transformer blocks sit in one `nn.ModuleList` (ours, Hugging
Face's, Llama-style code). The order of wraps is fixed, for a reason:

    1. checkpointing   (wraps each chosen block's forward in non-reentrant checkpointing)
    2. compile         (per block, so the checkpointed region is traced inside the block)

Compiling after checkpointing lets dynamo see the checkpoint as one higher-order op and
plan the recomputation itself; the other order would hide the compiled code inside an
eager recomputation. We compile per block rather than the whole model because the blocks
are identical: one graph is traced and reused by every block, so compile time does not grow
with depth (it is paid in every trial), and the embedding, head and loss stay in eager
where a variable sequence length costs nothing.

Import from the modules: `knobs.apply` (apply_model_knobs, the order above), `knobs.checkpoint`,
`knobs.compile`, `knobs.precision` and `knobs.support` (torch-free, read by the study side).
"""

from __future__ import annotations
