"""Applying the model-side knobs: the loss implementation, activation checkpointing,
torch.compile at its scope, AMP and TF32, the forced SDPA backend, the gradient scaler, the
CUDA allocator setting, and the rules for what a device and a model can run.

Works on any model whose transformer blocks sit in one `nn.ModuleList` (ours, Hugging
Face's, Llama-style code); the head-level knobs (compile_scope=blocks+head,
loss_impl=chunked, attention_mask=document) need the seams autotune's GPT has and are
`unsupported` on a model without them. The order is fixed, for a reason:

    0. checks          (everything the model cannot take is rejected before anything changes)
   0b. sdpa_backend    (a forced kernel's assumptions: attention through SDPA, no attention
                        dropout under a CPU's flash; `knobs.attention`)
    1. loss_impl       (sets the function the head computes its loss with: compile must see it)
    2. checkpointing   (wraps each chosen block's forward in non-reentrant checkpointing)
    3. compile         (at compile_scope: blocks, blocks+head or the whole model)
    4. parallelism     (several ranks: the DDP wrap, or FSDP2's fully_shard per block then the
                        root; `knobs.parallel`, torchtitan's order)

Compiling after checkpointing lets dynamo see the checkpoint as one higher-order op and
plan the recomputation itself; the other order would hide the compiled code inside an
eager recomputation (`knobs.compile` says how each scope keeps this order). Per-block
compile, the default scope, traces one graph that every identical block reuses, so compile
time does not grow with depth (it is paid in every trial).

Import from the modules: `knobs.apply` (apply_model_knobs, the order above), `knobs.loss`,
`knobs.checkpoint`, `knobs.compile`, `knobs.parallel`, `knobs.precision`, `knobs.attention`, `knobs.allocator` and
`knobs.support` (torch-free, read by the study side).
"""

from __future__ import annotations
