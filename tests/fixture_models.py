"""User models for the tests, loaded as `tests.fixture_models:<factory>` like a user's own code.

`make_llama`: a Llama-style layout (blocks at `model.layers`, RMSNorm, SwiGLU, untied head),
exposing `vocab_size` and `context_length` and returning the loss from forward(input_ids, labels).
`make_odd_path`: the same blocks at `backbone.stack`, a path autotune cannot guess.
`make_llama_reporting_its_process`: make_llama, after starting a process as a DataLoader starts
its workers and writing to $AUTOTUNE_TEST_REPORT where that process came from (and where this
one did), and the signals this process blocks and the handlers of SIGINT and SIGTERM (a fresh
interpreter's)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100
VOCAB = 300
CONTEXT = 64
WIDTH = 32
HEADS = 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.o_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.post_attention_layernorm = RMSNorm(WIDTH)
        self.gate_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down_proj = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, hidden_states: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
        B, T, C = hidden_states.shape
        q, k, v = self.qkv(self.input_layernorm(hidden_states)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        h = hidden_states + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Inner(nn.Module):
    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(n_layers))
        self.norm = RMSNorm(WIDTH)


class LlamaLike(nn.Module):
    vocab_size = VOCAB
    context_length = CONTEXT

    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        self.model = Inner(n_layers)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        for layer in self.blocks():
            h = layer(h, causal=True)  # a keyword argument, as Hugging Face layers take
        logits = self.lm_head(self.model.norm(h))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class OddPath(LlamaLike):
    """Blocks where no common path points: `backbone.stack`."""

    def __init__(self, n_layers: int = 2) -> None:
        super().__init__(n_layers)
        self.backbone = nn.Module()
        self.backbone.stack = self.model.layers
        del self.model.layers

    def blocks(self) -> nn.ModuleList:
        return self.backbone.stack


def make_llama() -> LlamaLike:
    return LlamaLike()


def make_odd_path() -> OddPath:
    return OddPath()


def not_a_module() -> str:
    return "a string"


def make_llama_reporting_its_process() -> LlamaLike:
    context = multiprocessing.get_context()  # a DataLoader's workers: torch's default context
    parents = context.SimpleQueue()
    child = context.Process(target=_put_parent_pid, args=(parents,))
    child.start()
    child_parent = parents.get()
    child.join()
    report = {
        "start_method": context.get_start_method(),
        "factory_pid": os.getpid(),
        "factory_parent": os.getppid(),  # the fork server's pid when forked from it, else the tuner's
        "child_parent": child_parent,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "sigint": repr(signal.getsignal(signal.SIGINT)),
        "sigterm": repr(signal.getsignal(signal.SIGTERM)),
    }
    with open(os.environ["AUTOTUNE_TEST_REPORT"], "w", encoding="utf-8") as f:
        json.dump(report, f)
    return LlamaLike()


def _put_parent_pid(queue) -> None:
    queue.put(os.getppid())
