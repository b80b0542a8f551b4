"""Builds a tiny random-weight LoRA adapter for the tiny model (``demo/tiny_model.py``).

A PEFT-format folder (``adapter_config.json``, ``adapter_model.safetensors``): rank-8 A and B
matrices on every layer's ``q_proj`` and ``v_proj``, as vLLM's ``--lora-modules`` loads them.
Random weights: what is exercised is the server's adapter scheduling, not the text. Runs in
the vLLM virtual environment (it needs torch and safetensors):

    .venv-vllm/bin/python demo/tiny_lora.py OUT_DIR SEED
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tiny_model import HIDDEN, LAYERS

RANK = 8
TARGETS = ("q_proj", "v_proj")


def build(out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for target in TARGETS:
            name = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            a = torch.randn(RANK, HIDDEN, generator=generator) * 0.01
            b = torch.randn(HIDDEN, RANK, generator=generator) * 0.01
            tensors[f"{name}.lora_A.weight"] = a.contiguous()
            tensors[f"{name}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: tiny_lora.py OUT_DIR SEED")
    build(Path(sys.argv[1]), int(sys.argv[2]))
