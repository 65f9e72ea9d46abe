"""A generation recipe applied: `Recipe.apply_to_generation(model)` returns a `TunedGeneration`,
which generates as the recipe was measured.

    tuned = recipe.apply_to_generation(model, device="cuda")
    tokens = tuned.generate(prompts)                   # lists of token ids in, lists out
    model.generate(input_ids, **tuned.generate_kwargs)  # a transformers model: its own generate

autotune's GPT decodes through its cached decode loop (`model.decode`) with the recipe's cache,
compiled steps and attention kernels; a transformers model through `generate` with the
GenerationConfig fields the recipe measured (`generate_kwargs`: a static cache, its compile
settings, `disable_compile` when the recipe measured it eager). The model is cast to the
recipe's dtype, in place. Prompts are cut into batches of the recipe's batch size and
left-padded to its bucket; a static cache holds the recipe's longest prompt plus its new
tokens, and asking for more is refused in one line rather than overflowing it (`max_len` makes
a longer one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from autotune.config import padded_width
from autotune.errors import UsageError
from autotune.registry import generates_with_hf

if TYPE_CHECKING:
    import torch


class TunedGeneration:
    """A model generating as a generation recipe (`recipe`, an `autotune.Recipe`) says."""

    def __init__(
        self,
        recipe: Any,
        model: "torch.nn.Module",
        *,
        device: "str | torch.device | None" = None,
        max_len: int | None = None,
    ) -> None:
        from autotune.knobs.generation import gpt_decoder
        from autotune.knobs.hf_generation import HfGenerator, generation_kwargs

        self.recipe, self.cfg = recipe, recipe.config
        self.new_tokens = int(recipe.workload["new_tokens"])
        longest = max(recipe.workload["prompt_lens"])
        self.max_len = max_len or padded_width(longest, self.cfg.prompt_bucket) + self.new_tokens
        if device is not None:
            model.to(device)
        self.model = model
        if generates_with_hf(model):
            from autotune.knobs.support import check_model_supported

            check_model_supported(model, self.cfg)
            self._generator: Any = HfGenerator(model, self.cfg)
            device_kind = next(model.parameters()).device.type
            self.generate_kwargs = generation_kwargs(self.cfg, self.new_tokens, device_kind=device_kind)
        elif callable(getattr(model, "forward_cached", None)):
            self._generator = gpt_decoder(model, self.cfg, max_len=self.max_len)
            self.generate_kwargs = {}
        else:
            raise UsageError(
                f"apply_to_generation: {type(model).__name__} is neither autotune's GPT (forward_cached) nor a "
                "transformers model (generate)"
            )

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | None = None) -> list[list[int]]:
        """Greedy tokens for each prompt (lists of token ids), `max_new_tokens` each (the recipe's
        by default), in batches of the recipe's batch size."""
        from autotune.model.decode import left_pad

        new_tokens = max_new_tokens or self.new_tokens
        batch = self.cfg.batch_size
        out: list[list[int]] = []
        for start in range(0, len(prompts), batch):
            rows = [list(p) for p in prompts[start : start + batch]]
            width = padded_width(max(len(p) for p in rows), self.cfg.prompt_bucket)
            if self.cfg.kv_cache == "static" and width + new_tokens > self.max_len:
                raise UsageError(
                    f"prompts of {width} tokens (padded) plus {new_tokens} new tokens pass the static cache's "
                    f"{self.max_len} positions: apply_to_generation(model, max_len={width + new_tokens})"
                )
            filled = rows + [rows[0]] * (batch - len(rows))  # a static cache's batch is the recipe's
            tokens = self._generator.generate(left_pad(filled, self.cfg.prompt_bucket), new_tokens)
            out += tokens[: len(rows)].tolist()
        return out
