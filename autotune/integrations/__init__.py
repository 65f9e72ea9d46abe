"""A recipe in the words of the training libraries people use, as data: Hugging Face
`TrainingArguments` keyword arguments (`hf`) and Lightning `Trainer` / DataLoader keyword
arguments (`lightning`). Field names follow the installed version of each library, and the
arguments are checked by constructing the library's own object before they are returned.

    from transformers import TrainingArguments
    from autotune.integrations import hf
    args = TrainingArguments(output_dir="out", **hf.training_arguments(recipe))

    import lightning
    from autotune.integrations import lightning as autotune_lightning
    trainer = lightning.Trainer(max_steps=1000, **autotune_lightning.trainer_kwargs(recipe))

`autotune export --format hf|lightning` prints the same as Python to paste, with comments on
what the library cannot express; `--format hf-json|lightning-json` prints it as JSON.
Neither library is imported by `import autotune`; each module imports its library when called.
"""

from __future__ import annotations
