"""Train a GPT-2 (autotune's, or a Hugging Face one) in plain PyTorch with an autotune recipe
applied: the few lines it takes.

    python examples/train_gpt2.py --steps 20                                     # CPU is fine
    python examples/train_gpt2.py --model hf:llama-tiny --steps 20               # a transformers model
    python examples/train_gpt2.py --recipe recipes/gpt2-nvidia-h200.json --model hf:gpt2 --steps 100

Without --recipe the untuned defaults run (float32, no compile, padded token-budget batches).
The data is synthetic: documents of random token ids with random lengths, as a plain Python
list of lists, the simplest dataset `Recipe.dataloader` takes (see its docstring). The loader
is made for the model (`for_model=model`): its context, and the labels it expects (a Hugging
Face model shifts labels itself, so its batches carry them unshifted).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import autotune
from autotune.config import TrainConfig
from autotune.model.introspect import model_shape
from autotune.model.load import build_model


def synthetic_documents(count: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` documents of 8..max_len random token ids (each one whole training sequence)."""
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab_size) for _ in range(rng.randint(8, max_len))] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-tiny", help="gpt2, ..., gpt2-tiny (default), hf:gpt2, hf:llama-tiny")
    parser.add_argument("--recipe", default=None, help="an autotune recipe file (default: untuned settings)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args.model)
    shape = model_shape(model)
    recipe = autotune.Recipe.load(args.recipe) if args.recipe else autotune.Recipe(config=TrainConfig())
    dataset = synthetic_documents(512, shape.context_length, shape.vocab_size, args.seed)

    # --- the recipe, applied ---------------------------------------------------------------
    model = recipe.apply_to_model(model, device=device)  # checkpoint the chosen blocks, then compile
    loader = recipe.dataloader(dataset, for_model=model, seed=args.seed)  # its context and labels; budget batches
    scaler = recipe.grad_scaler(device.type)  # enabled only for float16
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    # ----------------------------------------------------------------------------------------

    model.train()
    step = 0
    while step < args.steps:  # epochs
        for batch in loader:
            started = time.perf_counter()
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with recipe.autocast(device.type):  # AMP dtype and the forced SDPA backend
                output = model(**batch)
            loss = getattr(output, "loss", output)  # Hugging Face returns .loss; autotune's GPT the loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            tokens = int((batch["labels"] != -100).sum())
            print(
                f"step {step:4d}  loss {loss.item():.4f}  batch {tuple(batch['input_ids'].shape)}  "
                f"{tokens / (time.perf_counter() - started):,.0f} tokens/s",
                flush=True,
            )
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":  # DataLoader workers re-import this file under spawn
    main()
