"""Builds a tiny random-weight Llama and a byte-level BPE tokenizer into one folder.

No model can be downloaded here, and none is needed to exercise a real vLLM: the
scheduler, KV cache and metrics behave the same with random weights. Runs in the vLLM
virtual environment (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python demo/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

# Shapes the CPU attention kernel accepts: head_dim 64 (16 is rejected). Small enough (~3 M
# parameters) that a decode step of a full batch stays far shorter than a poll; a context of
# 4096 positions (RoPE: no weights) lets a prompt be long enough that its prefill is a clear
# multiple of a short one's on any CPU.
HIDDEN, HEADS, LAYERS, VOCAB, CONTEXT = 256, 4, 4, 512, 4096

WORDS = [
    "the",
    "request",
    "waits",
    "in",
    "the",
    "queue",
    "while",
    "the",
    "scheduler",
    "admits",
    "a",
    "batch",
    "and",
    "the",
    "engine",
    "runs",
    "prefill",
    "then",
    "decode",
    "steps",
    "reading",
    "the",
    "key",
    "value",
    "cache",
    "for",
    "every",
    "token",
    "it",
    "generates",
    "latency",
    "throughput",
    "tokens",
    "second",
    "prompt",
    "output",
    "model",
    "weights",
    "memory",
    "bandwidth",
]


def corpus() -> list[str]:
    """A deterministic text to train the tokenizer on (words, digits, punctuation)."""
    lines = []
    for i in range(400):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)]
        lines.append(" ".join(words) + f" {i}, {i * 37 % 1000}.")
    return lines


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=CONTEXT,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]))
