"""A prompts file as a generation workload: the token length of each prompt (what the tokens
say does not change the work a model does on them, so the workload keeps the lengths and the
measurement draws its own token ids). Torch-free: the tuner reads it before any trial.

    PATH.txt     one prompt a line (empty lines skipped)
    PATH.jsonl   one JSON object a line, its prompt under "prompt" or "text"

Tokenized as the model's data is (`data.tokenize.choose_tokenizer`: GPT-2's BPE when the
vocabulary holds it and tiktoken has it offline, else UTF-8 bytes)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from autotune.config import MAX_PROMPTS
from autotune.data.tokenize import choose_tokenizer
from autotune.errors import UsageError

MAX_PROMPTS_FILE_BYTES = 256 << 20  # a quarter GiB of prompts is a benchmark corpus already


def prompt_lengths(path: str | Path, *, vocab_size: int) -> tuple[int, ...]:
    """The token length of every prompt in `path`; UsageError (one line) for a file that is not one."""
    path = Path(path)
    texts = _prompts(path, _read(path))
    if not texts:
        raise UsageError(f'--prompts {path}: no prompts in it (one a line, or JSON lines with a "prompt")')
    if len(texts) > MAX_PROMPTS:
        raise UsageError(f"--prompts {path}: {len(texts)} prompts, more than {MAX_PROMPTS}; take a sample of them")
    tokenizer = choose_tokenizer(vocab_size, where=f"--prompts {path}")
    return tuple(max(1, len(tokenizer.encode(text.encode("utf-8")))) for text in texts)


def _read(path: Path) -> str:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block until a writer comes
            raise UsageError(f"--prompts {path}: not a regular file")
        if os.path.getsize(path) > MAX_PROMPTS_FILE_BYTES:
            raise UsageError(f"--prompts {path}: larger than {MAX_PROMPTS_FILE_BYTES >> 20} MiB; take a sample of it")
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--prompts {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--prompts {path}: not UTF-8 text (byte {exc.start})") from None


def _prompts(path: Path, text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    if path.suffix.lower() != ".jsonl":
        return lines
    prompts = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--prompts {path}: line {number} is not JSON ({exc.msg})") from None
        prompt = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
        if not isinstance(prompt, str):
            raise UsageError(f'--prompts {path}: line {number} has no "prompt" or "text" string')
        prompts.append(prompt)
    return prompts
