"""Train a GPT-2 in plain PyTorch with an autotune recipe applied: the few lines it takes.

    python examples/train_gpt2.py --steps 20                                    # CPU is fine
    python examples/train_gpt2.py --recipe recipes/gpt2-nvidia-h200.json --model gpt2 --steps 100

Without --recipe the untuned defaults run (float32, no compile, padded token-budget batches).
The data is synthetic: documents of random token ids with random lengths, as a plain Python
list of lists, the simplest dataset `Recipe.dataloader` takes (see its docstring).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import autotune
from autotune.config import TrainConfig
from autotune.model.load import build_model


def synthetic_documents(count: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` documents of 8..max_len random token ids (each one whole training sequence)."""
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab_size) for _ in range(rng.randint(8, max_len))] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-tiny", help="gpt2, gpt2-medium, ..., gpt2-tiny (default)")
    parser.add_argument("--recipe", default=None, help="an autotune recipe file (default: untuned settings)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args.model)
    # The recipe's context length, unless it was measured with a longer one than this model has.
    recipe = autotune.Recipe.load(args.recipe) if args.recipe else autotune.Recipe(config=TrainConfig())
    seq_len = min(recipe.model.get("seq_len") or model.context_length, model.context_length)
    dataset = synthetic_documents(512, seq_len + 1, model.vocab_size, args.seed)

    # --- the recipe, applied ---------------------------------------------------------------
    model = recipe.apply_to_model(model, device=device)  # checkpoint the chosen blocks, then compile
    loader = recipe.dataloader(dataset, seq_len=seq_len, seed=args.seed)  # workers, pinning, token budget
    scaler = recipe.grad_scaler(device.type)  # enabled only for float16
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    # ----------------------------------------------------------------------------------------

    model.train()
    step = 0
    while step < args.steps:  # epochs
        for input_ids, labels in loader:
            started = time.perf_counter()
            input_ids = input_ids.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with recipe.autocast(device.type):  # AMP dtype and the forced SDPA backend
                loss = model(input_ids, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            tokens = int((labels != -100).sum())
            print(
                f"step {step:4d}  loss {loss.item():.4f}  batch {tuple(input_ids.shape)}  "
                f"{tokens / (time.perf_counter() - started):,.0f} tokens/s",
                flush=True,
            )
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":  # DataLoader workers re-import this file under spawn
    main()
