"""Runbook text of the cause alerts: the method's reading of each, how to confirm, what to change.

``inferwatch generate`` renders each entry, together with the alert's expression and
thresholds from the heuristics spec, into ``alerts/runbooks/<Alert>.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.method.panels import Panel


@dataclass(frozen=True)
class Runbook:
    meaning: str
    confirm: tuple[tuple[Panel, str], ...]
    causes: tuple[str, ...]  # most likely first
    actions: tuple[str, ...]
    escalate: str


CAUSE_RUNBOOKS: dict[str, Runbook] = {
    "InferenceBackendDown": Runbook(
        meaning=(
            "The sidecar cannot read the inference server's `/metrics` (connection refused, "
            "timeout, HTTP error, or a page that is not Prometheus text), or Prometheus cannot "
            "scrape the sidecar at all. Nothing else about this pod can be diagnosed until it "
            "is back, so its latency alerts are inhibited."
        ),
        confirm=(
            (Panel.FIRING_ALERTS, "the pod listed under InferenceBackendDown"),
            (Panel.RUNNING_WAITING, "the pod's series stop"),
        ),
        causes=(
            "The server process died or is restarting (OOM kill, CUDA error, crash on a bad "
            "request): check `kubectl describe pod` / the container's exit code and logs.",
            "The server is still starting (model download, weight loading, CUDA graph capture "
            "can take minutes): the alert clears when it is ready.",
            "Metrics are disabled or elsewhere: vLLM with `--disable-log-stats` has no `vllm:` "
            "metrics; SGLang needs `--enable-metrics`; llama.cpp needs `--metrics`; Triton "
            "serves them on port 8002.",
            "The sidecar points at the wrong URL or port (`--backend-url`), or the server's "
            "`/metrics` is behind authentication the sidecar does not send.",
            "The sidecar itself is down (`up == 0` for its job).",
        ),
        actions=(
            "Read the sidecar's log: it names the cause once, e.g. `backend scrape failing: "
            "cannot connect to http://127.0.0.1:8000/metrics: [Errno 111] Connection refused`.",
            "`curl -s http://<pod>:<port>/metrics | head` from inside the pod to see what the "
            "server answers.",
            "If the server crash-loops, roll back the last change (model, flags, image).",
        ),
        escalate=(
            "Page the serving owner at once if every replica of a model is down (users get "
            "errors), or if a replica does not come back within 10 minutes of a restart."
        ),
    ),
    "InferenceQueuedWhileIdle": Runbook(
        meaning=(
            "Requests are waiting to be scheduled while the accelerator has nothing to do: "
            "continuous batching is not admitting queued work. In the method's terms this is "
            "a **scheduling or system** problem, not a capacity one: adding replicas will not "
            "help, the work already here is not reaching the GPU. With NVML, idle means every "
            "GPU was busy less than `--idle-threshold` of the poll interval; without it, the "
            "engine made no scheduler step for over a second."
        ),
        confirm=(
            (Panel.QUEUED_WHILE_IDLE, "non-zero seconds in the selected range"),
            (Panel.RUNNING_WAITING, "waiting > 0 while running is flat or low"),
            (Panel.GPU_BUSY, "low while the queue is non-empty"),
            (Panel.FRONTEND_CPU, "a saturated API process points at the CPU side"),
        ),
        causes=(
            "The engine loop is blocked: a stuck or very slow step (NCCL/collective hang in "
            "tensor parallel, a CPU-side stall, a process paused by the OS or a debugger).",
            "The CPU cannot keep up: tokenization, detokenization or scheduling in Python at "
            "high concurrency, a slow (non-Rust) tokenizer, too few CPU cores for the pod.",
            "Admission limits with free capacity: requests deferred for a LoRA adapter "
            "budget, KV transfer (disaggregated prefill) or structured-output grammar "
            "compilation.",
            "Too small a KV cache for the prompt lengths, so a waiting request cannot be "
            "admitted even though the running batch is small.",
        ),
        actions=(
            "Check the engine's log for stalls and `py-spy dump --pid <engine pid>` to see "
            "where the loop is.",
            "vLLM: raise `--api-server-count` (several frontend processes), make sure the "
            "tokenizer is a fast (Rust) one, give the pod more CPU cores; SGLang: "
            "`--tokenizer-worker-num`; TGI: `--tokenization-workers`.",
            "If prompts cannot be admitted for lack of KV space, raise "
            "`--gpu-memory-utilization` (TGI: `--cuda-memory-fraction`) or lower "
            "`--max-model-len` (TGI: `--max-total-tokens`).",
        ),
        escalate=(
            "If it lasts longer than a few minutes with the GPU idle, restart the pod (the "
            "engine may be hung) and escalate to the serving framework owners with the stack "
            "dump."
        ),
    ),
    "InferenceQueueingDelay": Runbook(
        meaning=(
            "Time to first token is high and most of it is time spent waiting to be "
            "scheduled, across the replicas of the model. In the method's terms the phase "
            "is prefill but the layer is **scheduling / capacity**: the GPUs are busy with "
            "other requests, the prompts are not slow to compute."
        ),
        confirm=(
            (Panel.TTFT_SPLIT, "the queue part dominates the mean TTFT"),
            (Panel.RUNNING_WAITING, "waiting grows while running sits at its maximum"),
            (Panel.GPU_BUSY, "high: the GPUs are working, not idling"),
            (Panel.KV_CACHE, "often near full at the same time"),
        ),
        causes=(
            "More traffic than the replicas can serve (request or token rate above the "
            "baseline's saturation point).",
            "A batch-size limit below what the GPU could run: `--max-num-seqs` (vLLM), "
            "`--max-running-requests` (SGLang), `--max-batch-total-tokens` (TGI).",
            "The KV cache is full, so new requests cannot be admitted (see "
            "InferenceKVCachePressure).",
            "A few very long requests hold the batch (long outputs, `n > 1`, beam search).",
        ),
        actions=(
            "Scale out: add replicas (or let the autoscaler act on `inferwatch_requests_waiting`).",
            "If the GPU has headroom (GPU busy below ~80 %, KV cache not full), raise "
            "`--max-num-seqs` / `--max-num-batched-tokens` (vLLM), `--max-batch-prefill-tokens` "
            "/ `--max-batch-total-tokens` (TGI).",
            "Free KV memory per request: `--kv-cache-dtype fp8`, a quantized model, a lower "
            "`--max-model-len`.",
            "Rate-limit or shed load at the gateway while capacity is added.",
        ),
        escalate=(
            "Escalate to capacity planning if scaling out is blocked (no GPUs, quota), or if "
            "TTFT stays high after capacity was added (then the cause is not capacity)."
        ),
    ),
    "InferencePrefillBottleneck": Runbook(
        meaning=(
            "Time to first token is high although requests are scheduled at once and "
            "per-token decode latency is normal: the **prefill computation** itself is slow. "
            "Prefill is compute-bound and grows about quadratically with prompt length (a "
            "4,096-token prompt costs ~64x a 512-token one)."
        ),
        confirm=(
            (Panel.TTFT_SPLIT, "the prefill part dominates, the queue part is small"),
            (Panel.REQUEST_LENGTHS, "prompt lengths went up"),
            (Panel.PREFIX_CACHE, "a low or dropping hit ratio"),
            (Panel.ITL, "normal"),
        ),
        causes=(
            "Longer prompts: a new system prompt, RAG context or conversation history.",
            "Prompt caching not used: prefix caching disabled, or prompts that do not share a "
            "prefix (a timestamp or user id at the start of the system prompt defeats it).",
            "Prefill chunks too small (`--max-num-batched-tokens` low with chunked prefill), "
            "so one prompt takes many scheduler steps.",
            "Slower hardware for this replica (another GPU type, throttling, MIG slice).",
        ),
        actions=(
            "Shorten prompts; move variable parts to the end so the prefix can be cached.",
            "vLLM: `--enable-prefix-caching` (default on in V1); SGLang: radix cache on "
            "(default); TGI v3: prefix caching on by default (`PREFIX_CACHING=1`).",
            "Raise the prefill chunk: `--max-num-batched-tokens` (vLLM), "
            "`--chunked-prefill-size` (SGLang), `--max-batch-prefill-tokens` (TGI).",
            "For very long prompts at scale, disaggregate prefill from decode.",
        ),
        escalate=(
            "Escalate to the application owners if prompt length grew (a product change), or "
            "to the platform team if one replica's hardware is slower."
        ),
    ),
    "InferenceDecodeBottleneck": Runbook(
        meaning=(
            "Per-token latency is high while time to first token is normal, and decode runs "
            "well above the hardware floor (model bytes / memory bandwidth). Decode is "
            "**memory-bandwidth bound**: every step reads all weights and the KV cache; "
            "being far above the floor means time is lost elsewhere."
        ),
        confirm=(
            (Panel.ITL_VS_FLOOR, "ITL p95 far above the floor line"),
            (Panel.STEP_TOKENS, "how large the decode batch is"),
            (Panel.KV_CACHE, "a large batch with long contexts makes KV reads dominate"),
            (Panel.GPU_ACTIVITY, "DRAM activity low while SM activity is high points at kernels"),
            (Panel.SPEC_DECODE, "a low acceptance: speculation costs more than it saves"),
            (Panel.LINK_SHARE, "NVLink near its peak in tensor parallel"),
        ),
        causes=(
            "A batch so large (many long sequences) that KV-cache reads dominate each step.",
            "Unoptimized kernels: eager mode (CUDA graphs off, `--enforce-eager`), an attention "
            "backend not suited to the GPU, a new model architecture without fused kernels.",
            "Interference from prefill in the same steps (see InferencePrefillStallsDecode).",
            "Throttled GPU clocks or a PCIe/NVLink bottleneck in tensor parallel "
            "(InferenceInterconnectSaturated).",
            "Speculative decoding whose drafts are mostly rejected: every rejected token is "
            "compute spent for nothing.",
        ),
        actions=(
            "Lower `--max-num-seqs` (vLLM) / `--max-running-requests` (SGLang) / "
            "`--max-batch-total-tokens` (TGI) if latency matters more than throughput.",
            "Remove `--enforce-eager`; try another attention backend; upgrade the serving "
            "framework for the model's kernels.",
            "`--kv-cache-dtype fp8` halves KV reads.",
            "Check InferenceGPUThrottling and the interconnect.",
        ),
        escalate=(
            "Escalate to the serving framework owners with the ITL, the floor and the batch "
            "size if kernel inefficiency is suspected."
        ),
    ),
    "InferenceDecodeAtHardwareFloor": Runbook(
        meaning=(
            "Mean per-token latency is within a small factor of the floor: each decode step "
            "cannot be faster than reading the model's weights once from GPU memory. This is "
            "informational: decode is **hardware-bound**, and tuning the scheduler will not "
            "lower per-token latency."
        ),
        confirm=(
            (Panel.ITL_VS_FLOOR, "ITL p95 close to the floor line"),
            (Panel.MEMORY_BANDWIDTH, "with --enable-mfu-metrics, read bandwidth near the peak"),
        ),
        causes=("The model is large for the GPU's memory bandwidth (expected).",),
        actions=(
            "Quantize the weights (FP8, INT8/INT4 AWQ/GPTQ): fewer bytes per step.",
            "Shard across more GPUs (tensor parallel) to add bandwidth.",
            "Speculative decoding emits several tokens per weight read.",
            "Use a smaller model if quality allows.",
        ),
        escalate="Nothing to escalate: take it into capacity and model-choice planning.",
    ),
    "InferenceKVCachePressure": Runbook(
        meaning=(
            "The KV cache is near full for minutes, or the scheduler keeps preempting "
            "requests (evicting their KV cache to be recomputed later). In the method's "
            "terms the layer is **memory**: it caps the batch size and wastes compute on "
            "recomputation."
        ),
        confirm=(
            (Panel.KV_CACHE_BY_ENGINE, "usage pinned near 100 %"),
            (Panel.PREEMPTIONS, "a steady rate, not a single burst"),
            (Panel.REQUEST_LENGTHS, "longer prompts or outputs than usual"),
            (Panel.RUNNING_WAITING, "waiting grows while running stays below --max-num-seqs"),
        ),
        causes=(
            "Longer contexts than the cache was sized for (prompt + output tokens).",
            "Too many concurrent sequences for the memory left after the weights.",
            "`--gpu-memory-utilization` set low, or another process holding GPU memory.",
        ),
        actions=(
            "vLLM: raise `--gpu-memory-utilization`, use `--kv-cache-dtype fp8`, lower "
            "`--max-num-seqs` or `--max-model-len`; TGI: `--cuda-memory-fraction`, "
            "`--max-batch-total-tokens`, `--max-total-tokens`; SGLang: "
            "`--mem-fraction-static`, `--max-running-requests`.",
            "A quantized model leaves more memory for the cache.",
            "Add replicas or GPUs (tensor parallel splits the cache too).",
        ),
        escalate=(
            "Escalate if preemptions continue after the cache was resized: requests may be "
            "longer than the deployment supports."
        ),
    ),
    "InferencePrefillStallsDecode": Runbook(
        meaning=(
            "The inter-token latency tail (p99) blows up relative to its median while prompt "
            "tokens are being prefilled: decode requests wait behind prefill work in the same "
            "scheduler steps. With chunked prefill, chunks that are too large make decode "
            "steps carry a big prefill; without it, a whole long prompt runs in one step. It "
            "stays silent while requests queue on an idle engine: a stall cuts every stream "
            "and is followed by a burst of prefill, which is InferenceQueuedWhileIdle's case."
        ),
        confirm=(
            (Panel.ITL, "p99 far above p50 while p50 stays flat"),
            (Panel.STEP_TOKENS, "large steps (prefill chunks) during the spikes"),
            (Panel.TOKEN_THROUGHPUT, "prompt tokens flowing at the same time"),
        ),
        causes=(
            "Chunked prefill disabled, or a chunk budget (`--max-num-batched-tokens`) far "
            "larger than needed for decode.",
            "Bursts of very long prompts next to streaming users.",
        ),
        actions=(
            "vLLM: `--enable-chunked-prefill` with a smaller `--max-num-batched-tokens` "
            "(e.g. 2048-8192); SGLang: a smaller `--chunked-prefill-size`; TGI: a smaller "
            "`--max-batch-prefill-tokens` (and `--waiting-served-ratio`).",
            "Too small a chunk slows prefill (many steps): watch TTFT while lowering it.",
            "At scale, separate prefill and decode onto different replicas.",
        ),
        escalate="Escalate if tuning the chunk size trades one SLO for the other.",
    ),
    "InferenceGPUUnderutilized": Runbook(
        meaning=(
            "Requests are running but the GPUs are mostly idle. In the method's terms the "
            "accelerator is **starved**: batches are too small, or the CPU side cannot "
            "prepare work fast enough."
        ),
        confirm=(
            (Panel.GPU_BUSY_BY_GPU, "busy well below 100 %"),
            (Panel.RUNNING_WAITING, "few running requests"),
            (Panel.STEP_TOKENS, "small steps"),
            (Panel.FRONTEND_CPU, "a saturated frontend points at the CPU"),
        ),
        causes=(
            "Low concurrency: clients send requests one at a time.",
            "A CPU bottleneck: tokenization, output processing, a single API-server process.",
            "Batch limits set too low (`--max-num-seqs`).",
            "Host-device transfers or sampling on the CPU (structured output, logits processors).",
        ),
        actions=(
            "If traffic is low, consolidate replicas (fewer, fuller GPUs).",
            "vLLM: `--api-server-count`, more CPU cores for the pod; raise `--max-num-seqs`.",
            "Send requests concurrently from clients.",
        ),
        escalate="Escalate to capacity planning if the fleet is over-provisioned.",
    ),
    "InferenceFrontendCPUSaturated": Runbook(
        meaning=(
            "The server's API/tokenizer process uses about a whole CPU core while the GPU is "
            "not busy: the **system** layer is the bottleneck. The frontend is one Python "
            "process per API server; at one core it cannot go any faster."
        ),
        confirm=(
            (Panel.FRONTEND_CPU, "close to 1 core"),
            (Panel.GPU_BUSY, "not saturated"),
            (Panel.REQUEST_LENGTHS, "long prompts/outputs mean more tokenizer work"),
        ),
        causes=(
            "High request rate for one API process (many small requests).",
            "A slow tokenizer (a Python one instead of the Rust `tokenizers`), or large "
            "prompts at high concurrency.",
            "Streaming with one SSE event per token at high concurrency (detokenization and "
            "serialization per token).",
        ),
        actions=(
            "vLLM: `--api-server-count N` to spread the frontend over several processes.",
            "Use the fast tokenizer (`tokenizer.json` present, `--tokenizer-mode auto`).",
            "Give the pod more CPU; check CPU limits and throttling in the container.",
        ),
        escalate="Escalate if several API processes are already saturated.",
    ),
    "InferenceClientGap": Runbook(
        meaning=(
            "The sidecar's canary (`serve --canary on`) streams a small request through the "
            "same path as users every few seconds and times its first token; the server's own "
            "TTFT histogram says how long the engine took. Their difference is what the path "
            "between the client and the engine adds: the network, an ingress or gateway, the "
            "API server's HTTP handling, tokenization and SSE framing. Alone, it says the "
            "engine is not what is slow. With a server-side cause (overload, KV pressure, a "
            "stall), fix that first: requests then also wait in the API server before the "
            "engine counts them, and `inferwatch diagnose` lists the cause first."
        ),
        confirm=(
            (Panel.CLIENT_GAP, "the gap above its threshold, and since when"),
            (Panel.TTFT, "the server's TTFT unchanged while the gap grew"),
            (Panel.FRONTEND_CPU, "near 1 core: tokenization/HTTP in the API process is slow"),
        ),
        causes=(
            "A proxy, ingress or gateway in front of the server buffers or queues: connection "
            "limits, a saturated ingress pod, response buffering turned on for SSE.",
            "The network: a cross-zone or cross-region hop, packet loss, DNS lookups per request.",
            "The API server's own work before the engine sees the request: a slow (Python) "
            "tokenizer, a chat template, request validation; it shows as Frontend CPU.",
            "TLS handshakes per request (no keep-alive between the client and the ingress).",
        ),
        actions=(
            "Point a second canary straight at the server's port (`--canary-url "
            "http://127.0.0.1:8000`) and compare: the hop whose gap differs is the one adding it.",
            "`curl -N -w '%{time_connect} %{time_starttransfer}\\n'` a streamed completion from "
            "the client side and from inside the pod.",
            "Turn off response buffering for the streaming route (nginx "
            "`proxy_buffering off`), keep connections alive, scale the ingress.",
        ),
        escalate=(
            "Escalate to the owner of the hop that adds the time (network, ingress, API "
            "gateway) with the canary's gap and the server's TTFT side by side."
        ),
    ),
    "InferenceRequestErrors": Runbook(
        meaning=(
            "A significant share of the model's finished requests ended in error or abort, "
            "across replicas. Aborts include clients disconnecting (timeouts, users "
            "cancelling), often a symptom of latency problems upstream of this alert."
        ),
        confirm=(
            (Panel.FINISHED_BY_REASON, "which reason grew: error or abort"),
            (Panel.TTFT, "latency spikes that make clients time out (aborts)"),
        ),
        causes=(
            "Client timeouts because latency is high (check the other alerts first).",
            "Requests the server rejects: prompts longer than `--max-model-len`, invalid "
            "parameters, a broken chat template.",
            "Engine errors (CUDA errors, out-of-memory on an unusual request).",
        ),
        actions=(
            "Read the server log for the error messages.",
            "Align client timeouts and `max_tokens` with the baseline's latencies.",
            "Roll back a recent model or template change.",
        ),
        escalate="Page the serving owner if errors (not aborts) exceed the threshold.",
    ),
    "InferenceCanaryFailing": Runbook(
        meaning=(
            "The sidecar's canary requests fail (time out, get HTTP errors, cannot connect, or "
            "get a broken stream) while the server's `/metrics` answers and looks healthy. "
            "Users on the same path fail too, and no server-side SLI counts their requests: "
            "the server never saw them, or saw them and could not answer. This alert pages "
            "even where the SLOs do the paging."
        ),
        confirm=(
            (Panel.CANARY_PROBES, "which result grew: timeout, http_error or connect_error"),
            (Panel.FINISHED_BY_REASON, "whether the server itself records errors"),
            (Panel.RUNNING_WAITING, "a server too busy to answer within the canary's timeout"),
        ),
        causes=(
            "The path in front of the server is broken: an ingress, gateway or load balancer "
            "route, a certificate, an expired credential (HTTP 401/403/5xx from the proxy).",
            "The server's API process hangs or refuses requests while its metrics endpoint "
            "still answers (a stuck event loop, an engine that stopped stepping).",
            "Overload: requests queue longer than the canary's timeout (`--canary-timeout`); "
            "then InferenceQueueingDelay or the TTFT objective fire as well.",
            "The canary's own configuration: a wrong `--canary-model` (HTTP 404) or token.",
        ),
        actions=(
            "Read the sidecar's log: each kind of failure is named once, e.g. `canary probe "
            "failing: HTTP 503 from http://ingress/v1/completions`.",
            "Send the same streamed request by hand from outside the cluster and from inside "
            "the pod; the first hop that fails is the broken one.",
            "Roll back the last change to the route, gateway or credentials.",
        ),
        escalate=(
            "Page the serving owner at once when every replica's canary fails (users get "
            "errors); the network or gateway owner if only the external path fails."
        ),
    ),
    "InferenceLatencyRegression": Runbook(
        meaning=(
            "Live TTFT or per-token latency is well above what the benchmark baseline "
            "measured at a comparable concurrency. The method's premise is a baseline: this "
            "alert says *which dimension regressed* since it was taken."
        ),
        confirm=(
            (Panel.TTFT_VS_BASELINE, "which of TTFT or ITL departed from the baseline"),
            (Panel.ITL_VS_BASELINE, "the same for per-token latency"),
            (Panel.REQUEST_LENGTHS, "compare with the baseline's prompt/output lengths"),
        ),
        causes=(
            "A change since the baseline: server version, flags, model, drivers, hardware.",
            "A different workload: longer prompts or outputs than the baseline's.",
            "Contention: another process on the GPU, throttling, a noisy neighbour.",
        ),
        actions=(
            "If TTFT regressed, follow InferencePrefillBottleneck / InferenceQueueingDelay; "
            "if ITL regressed, InferenceDecodeBottleneck.",
            "Re-run `inferwatch baseline` with the previous baseline file to see which cells "
            "regressed.",
            "Roll back the last change if it coincides.",
        ),
        escalate="Escalate to whoever made the change that coincides with the regression.",
    ),
    "InferenceInterconnectSaturated": Runbook(
        meaning=(
            "The communication layer: one of the GPU's links moves more than the threshold's "
            "share of its peak. NVLink carries tensor-parallel all-reduce (every layer, every "
            "step), PCIe the host's transfers (inputs, outputs, KV-cache offload, and "
            "tensor-parallel traffic on GPUs without NVLink). A link at its peak makes the "
            "GPUs wait for it: decode slows although compute and memory have room."
        ),
        confirm=(
            (Panel.LINK_SHARE, "the GPU's NVLink or PCIe share near 100 %"),
            (Panel.NVLINK_THROUGHPUT, "NVLink bytes/s at the peak line while tokens flow"),
            (
                Panel.PCIE_THROUGHPUT,
                "PCIe bytes/s at the peak line; a low peak line means a "
                "link trained below its generation or width",
            ),
            (Panel.ITL_VS_FLOOR, "ITL far above the floor while the GPU is busy"),
        ),
        causes=(
            "Tensor parallelism across more GPUs than the model needs: all-reduce per layer "
            "grows with the GPU count while each GPU's share of compute shrinks.",
            "Tensor parallelism over PCIe (no NVLink, or GPUs in different NVLink domains).",
            "KV-cache offload to host memory (CPU offload, LMCache) moving blocks both ways.",
            "A PCIe link trained at a lower generation or width than the slot allows (a riser, "
            "a BIOS setting, a degraded link).",
        ),
        actions=(
            "Prefer fewer GPUs per replica (tensor parallel 2 instead of 8) and more replicas, "
            "or pipeline parallelism across nodes instead of tensor parallelism.",
            "Keep a replica's GPUs in one NVLink domain (`nvidia-smi topo -m`).",
            "Check the link: `nvidia-smi -q -d PCIE` (current vs max generation and width), "
            "`nvidia-smi nvlink --status`.",
            "Reduce KV offload traffic: a larger GPU KV cache, or offload only cold prefixes.",
        ),
        escalate="Escalate to the platform team with the node, the GPU UUIDs and the topology.",
    ),
    "InferenceGPUThrottling": Runbook(
        meaning=(
            "The GPU's clocks are held down for thermal or hardware reasons (not the normal "
            "power cap under full load). Every kernel runs slower: prefill and decode alike."
        ),
        confirm=(
            (Panel.GPU_CLOCKS, "the SM clock dropping with throttling flagged"),
            (Panel.GPU_POWER, "temperature near the slowdown point"),
        ),
        causes=(
            "Cooling: a failed fan, blocked airflow, a hot data-centre row.",
            "Power delivery: a power-brake signal, a failing PSU.",
            "Hardware slowdown asserted by the board (often with Xid errors in dmesg).",
        ),
        actions=(
            "Check `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` on the node.",
            "Drain the node and move the workload while hardware is checked.",
        ),
        escalate="Escalate to the data-centre / hardware team with the node and GPU UUID.",
    ),
    "InferenceExporterGPUMissing": Runbook(
        meaning=(
            "The sidecar collected GPU metrics earlier and now cannot: a GPU vanished or "
            "NVML stopped answering. The GPU-based idle detection falls back to engine "
            "progress meanwhile."
        ),
        confirm=(
            (Panel.GPU_BUSY_BY_GPU, "a GPU's series stops"),
            (Panel.GPU_MEMORY, "the same"),
        ),
        causes=(
            "A GPU fell off the bus (Xid 79) or needs a reset.",
            "The driver was reloaded/upgraded under the running pod.",
            "The container lost access to the device (device plugin restart).",
        ),
        actions=(
            "`nvidia-smi` and `dmesg | grep -i xid` on the node.",
            "Restart the pod; if the GPU is gone, drain the node.",
        ),
        escalate="Escalate to the hardware team if the GPU does not come back after a reset.",
    ),
}


# What a capture (``serve --capture-dir``; ``--capture-on`` the alert, or ``inferwatch
# capture``) shows of each cause, read from the real vLLM captures in the tests: the
# engine's trace has one ``execute_context_<P>(<p>)_generation_<D>(<d>)`` span per step
# (P requests prefilling p tokens, D requests decoding d tokens).
STEP = "`execute_context_<P>(<p tokens>)_generation_<D>(<d tokens>)`"
EVIDENCE: dict[str, str] = {
    "InferenceQueuedWhileIdle": (
        f"In the engine's trace the steps ({STEP} spans) stop: gaps between consecutive "
        "steps as long as the stall, while `server-metrics-before.txt` shows requests "
        "waiting. In a real capture of a vLLM engine paused 2 s at a time "
        "(tests/test_capture_real.py) the longest gap between steps is 2.00 s. A fully hung "
        "engine takes the profiler's start call only when it runs again: the manifest says "
        "how long the call waited, and then the stacks are the evidence. `stacks-dump.txt` "
        "shows where each of the server's "
        "processes was at the trigger: an engine thread in a collective, a lock or a "
        "`recv` is the stall; the API server busy in tokenization is the CPU side."
    ),
    "InferenceQueueingDelay": (
        f"The engine's steps ({STEP}) run back to back with the batch full (D at "
        "`--max-num-seqs`): the queue is capacity, not a stall. Gaps between steps would "
        "point at InferenceQueuedWhileIdle's causes instead."
    ),
    "InferencePrefillBottleneck": (
        f"Steps with a large `context` token count ({STEP}) take most of the timeline; "
        "their duration against p is the prefill throughput. Long steps with few tokens "
        "mean slow kernels (look inside the step: attention vs. MLP)."
    ),
    "InferenceDecodeBottleneck": (
        f"Decode-only steps (`execute_context_0(0)_generation_<D>(<d>)`, {STEP}) and "
        "their durations: a step time that grows with D is the batch's memory traffic; "
        "gaps between steps are host overhead (scheduling, sampling, detokenization: see "
        "the API server's stacks)."
    ),
    "InferencePrefillStallsDecode": (
        "A prefill chunk blocking decode is one step with a large `context` count among "
        "short decode-only steps: the decode requests of that step wait as long as the "
        "chunk. Its duration is the ITL spike users saw; `--max-num-batched-tokens` bounds it."
    ),
    "InferenceGPUUnderutilized": (
        f"Gaps between the engine's steps ({STEP}) are time the accelerator waits on the "
        "host; inside a step, gaps between kernels (the CUDA stream rows in Perfetto) are "
        "launch overhead. The API server's stacks show whether the host is busy there."
    ),
    "InferenceFrontendCPUSaturated": (
        "`stacks.speedscope.json` (Left Heavy) of the API server process: tokenizer, "
        "detokenizer, JSON or the OpenAI protocol layer taking most samples is the "
        "bottleneck; a slow Python tokenizer shows up at once."
    ),
    "InferenceKVCachePressure": (
        f"Steps ({STEP}) whose decode count D drops and prefill count P jumps without new "
        "requests are preempted requests being recomputed."
    ),
    "InferenceLatencyRegression": (
        "Compare the trace's step durations with a capture taken at baseline load "
        "(`inferwatch capture` on a healthy replica): the same step shape taking longer is "
        "the hardware or the build; a different shape is the load."
    ),
}
