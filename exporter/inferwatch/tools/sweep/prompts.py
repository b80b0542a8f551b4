"""The sweep's prompts: generated from a word list to a token length, or read from JSONL.

A generated prompt is a shuffle of :data:`WORDS`, repeated, behind a tag unique to the run,
cell and request; :func:`calibrate` learns from two probe requests how many tokens the
server counts per word (see :mod:`inferwatch.tools.sweep.command`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.collect.stream import WORDS, Client, request_input
from inferwatch.settings import ConfigError

# Without usage in the stream, prompt lengths are estimated at this (English BPE ~1.3).
FALLBACK_TOKENS_PER_WORD = 1.3

# Distinct everyday words; a prompt repeats shuffles of the list.


def load_prompts(path: Path, api: str) -> tuple[dict[str, Any], ...]:
    """The request inputs of a JSONL file: ``{"prompt": ...}`` or ``{"messages": [...]}``.

    One JSON object per line with a string ``prompt`` or a ``messages`` list of
    ``{role, content}`` strings; blank lines are skipped. With ``--api chat`` a ``prompt``
    becomes one user message; ``messages`` need ``--api chat``. ConfigError names the line.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    inputs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            inputs.append(_prompt_input(line, api))
        except ValueError as exc:
            raise ConfigError(f"{path} line {number}: {exc}") from None
    if not inputs:
        raise ConfigError(f"{path}: no prompts")
    return tuple(inputs)


def _prompt_input(line: str, api: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if ("prompt" in doc) == ("messages" in doc):
        raise ValueError("needs exactly one of 'prompt' and 'messages'")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"]:
            raise ValueError("'prompt' must be a non-empty string")
        return request_input(doc["prompt"], api)
    if api != "chat":
        raise ValueError("'messages' need --api chat")
    messages = doc["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(f"messages[{i}] must have string 'role' and 'content'")
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}


def _tagged(tag: str, prompt_input: Mapping[str, Any]) -> dict[str, Any]:
    """The input with ``tag`` in front of its text (the first message's, for chat)."""
    if "prompt" in prompt_input:
        return {"prompt": f"{tag} {prompt_input['prompt']}"}
    first, *rest = prompt_input["messages"]
    return {"messages": [{**first, "content": f"{tag} {first['content']}"}, *rest]}


def _words(seed: str, count: int) -> str:
    """``count`` words: shuffles of :data:`WORDS`, one after the other, seeded."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        batch = list(WORDS)
        rng.shuffle(batch)
        out.extend(batch)
    return " ".join(out[:count])


@dataclass(frozen=True)
class Calibration:
    """Prompt tokens as the server counts them: ``fixed + per_word x words``."""

    fixed: float
    per_word: float

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.fixed) / self.per_word))


@dataclass(frozen=True)
class Prompts:
    """The input of every request: generated to a token length, or the file's in turn."""

    api: str
    seed: int
    calibration: Calibration | None = None
    file: tuple[dict[str, Any], ...] = ()

    def generated(self, tag: str, words: int) -> dict[str, Any]:
        return _tagged(tag, request_input(_words(tag, words), self.api))

    def tag(self, cell: int, index: int) -> str:
        return f"{self.seed}.{cell}.{index}"

    def for_request(self, cell: int, index: int, prompt_tokens: int) -> dict[str, Any]:
        tag = self.tag(cell, index)
        if self.file:
            return _tagged(tag, self.file[index % len(self.file)])
        assert self.calibration is not None
        return self.generated(tag, self.calibration.words_for(prompt_tokens))


async def calibrate(
    client: Client, prompts: Prompts, probe_cell: int, note: Callable[[str], None]
) -> Prompts:
    """Prompts with the token calibration: probes of one and two passes of :data:`WORDS`
    give the tokens per pass and the fixed tokens the API adds (``usage.prompt_tokens``).
    The probes are tagged like the requests of a cell, so their tags cost what the
    requests' tags do."""
    counts = []
    for passes in (1, 2):
        text = prompts.generated(prompts.tag(probe_cell, passes), passes * len(WORDS))
        counts.append((await client.probe(text)).prompt_tokens)
    if None in counts or counts[1] <= counts[0]:
        note(
            "the server reports no usable prompt token usage: prompt lengths are estimated at "
            f"{FALLBACK_TOKENS_PER_WORD} tokens per word"
        )
        calibration = Calibration(fixed=0.0, per_word=FALLBACK_TOKENS_PER_WORD)
    else:
        per_pass = counts[1] - counts[0]
        calibration = Calibration(fixed=counts[0] - per_pass, per_word=per_pass / len(WORDS))
    return Prompts(prompts.api, prompts.seed, calibration)
