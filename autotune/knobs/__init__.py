"""Applying the knobs: the loss implementation, activation checkpointing, torch.compile at its
scope, AMP and TF32, the forced SDPA backend, the gradient scaler, the CUDA allocator setting,
the ranks' DDP or FSDP2 wrap, and the rules for what a device and a model can run.

Works on any model whose transformer blocks sit in one `nn.ModuleList` (ours, Hugging
Face's, Llama-style code); the head-level knobs (compile_scope=blocks+head,
loss_impl=chunked, attention_mask=document) need the seams autotune's GPT has and are
`unsupported` on a model without them. What the model cannot take is rejected before anything
changes; then each stage's hooks run in their one order, its reasons beside it, in `knobs.apply`
(model, optimizer, step) and `knobs.process` (the trial process's environment). Per-block
compile, the default scope, traces one graph that every identical block reuses, so compile time
does not grow with depth (it is paid in every trial). `knobs.support` is torch-free (the study
side reads it).
"""

from __future__ import annotations
