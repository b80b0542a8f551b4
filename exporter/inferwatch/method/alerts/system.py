"""The system layer: the server's CPU side, and the path between the client and the engine."""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, value_of, window_mean
from inferwatch.method.alerts.scheduling.queued_while_idle import queued_while_idle_on_a
from inferwatch.method.scenario import (
    CANARY_OK,
    ROUTER,
    TGI_LE,
    A,
    B,
    Dist,
    Router,
    Scenario,
    Worker,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE, TTFT

# ---------------------------------------------------------------------------------------
# InferenceFrontendCPUSaturated

FRONTEND_BUSY = Scenario(
    # The frontend burns 0.98 cores on A (no NVML there); on B as much, but its GPUs are
    # 95 % busy: the GPU is not waiting (near miss).
    "frontend CPU saturated",
    (
        healthy(A, frontend_cpu_cores=0.98, gpu_busy=None, gpu_collector="0x40"),
        healthy(B, frontend_cpu_cores=0.98, gpu_busy=(0.95, 0.95)),
    ),
    file="system.yaml",
    place=2,
    fires={
        "InferenceFrontendCPUSaturated": [instance_alert(A, value=0.98)]  # cores
    },
    silent=("InferenceExporterGPUMissing",),  # A never had a GPU: nothing went missing
)

FRONTEND_CPU_SATURATED = Alert(
    name="InferenceFrontendCPUSaturated",
    order=10,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    explains=(
        "InferenceQueuedWhileIdle",
        "InferenceQueueingDelay",
        "InferenceGPUUnderutilized",
        *USERS_SEE,
    ),
    for_default="5m",
    summary="API server / tokenizer CPU saturated on {{ $labels.instance }}",
    description='The server\'s frontend process used {{ $value | printf "%%.2f" }} CPU cores over '
    "%(window)s (threshold %(t.frontend_cpu_cores)s) while the GPU was not busy: "
    "tokenization, detokenization and HTTP handling in one Python process are the "
    "bottleneck.",
    when=(Cond("frontend_cpu", ">", "frontend_cpu_cores"),),
    unless=(Cond("gpu_busy", ">", "gpu_busy_high"),),
    evidence=(
        "`stacks.speedscope.json` (Left Heavy) of the API server process: tokenizer, "
        "detokenizer, JSON or the OpenAI protocol layer taking most samples is the "
        "bottleneck; a slow Python tokenizer shows up at once."
    ),
    scenarios=(FRONTEND_BUSY,),
)

# ---------------------------------------------------------------------------------------
# InferenceClientGap

SLOW_PATH = Scenario(
    # The canary's first tokens come 250 ms after the server's own TTFT on A; B's path adds
    # 40 ms (near miss).
    "client path adds to the first token",
    (
        healthy(A, canary_gap="0.25x40", canary_probes=CANARY_OK),
        healthy(B, canary_gap="0.04x40", canary_probes=CANARY_OK),
    ),
    file="system.yaml",
    place=3,
    fires={
        # 250 ms later than the server's TTFT; its mean TTFT 400 ms.
        "InferenceClientGap": [instance_alert(A, value=0.25, queries=(0.4,))]
    },
    silent=("InferenceCanaryFailing",),
)

CLIENT_GAP = Alert(
    name="InferenceClientGap",
    order=11,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    for_default="5m",
    summary="The path to {{ $labels.instance }} adds {{ $value | humanizeDuration }} to the "
    "first token",
    description="The canary's first tokens from {{ $labels.model }} arrive {{ $value | "
    "humanizeDuration }} later than the server's own TTFT says (medians over the last "
    "%(window)s; threshold %(t.client_gap_seconds)ss; the server's mean TTFT "
    + value_of(window_mean(f"inferwatch_{TTFT}"), INSTANCE, "humanizeDuration")
    + "). The time is spent between the client and the engine: the network, an ingress "
    "or gateway, the API server's HTTP handling and tokenization, or SSE framing.",
    when=(Cond("canary_ttft_gap", ">", "client_gap_seconds"),),
    symptom=True,
    scenarios=(SLOW_PATH,),
)

# ---------------------------------------------------------------------------------------
# InferenceServerCPUStarved

CPU_STARVED = Scenario(
    # A's server runs 1.5 cores and waits as long again for one (busy neighbours, a CPU
    # limit that throttles it); B's waits 0.4 s per 2 s of run time, a sixth (near miss).
    "the server's threads wait for CPU",
    (
        healthy(
            A,
            server_cpu_cores=1.5,
            server_cpu_wait=1.5,
            node_cpu_pressure=0.6,
            server_cpu_throttled=0.3,
        ),
        healthy(B, server_cpu_cores=2.0, server_cpu_wait=0.4, node_cpu_pressure=0.2),
    ),
    file="system.yaml",
    place=4,
    fires={
        # 9.82 requests running; waits 50 % of its ready time, node CPU pressure 60 %, the
        # cgroup throttled 0.3 s/s.
        "InferenceServerCPUStarved": [instance_alert(A, value=9.82, queries=(0.5, 0.6, 0.3))]
    },
)

CPU_WAIT_WITHOUT_TRAFFIC = Scenario(
    # A's server waits as long for a CPU as it runs, but has no request to serve: nothing
    # it serves is slowed (near miss).
    "the server's threads wait for CPU while it serves nothing",
    (healthy(A, running=(0,), waiting=(0,), server_cpu_cores=0.2, server_cpu_wait=0.2),),
    file="system.yaml",
    place=5,
    fires={},
    silent=("InferenceServerCPUStarved",),
)

STALL_WITH_CPU_WAIT = Scenario(
    # A's engine is stalled 30 % of the window with requests queued while its other threads
    # (a busy-polling worker, the API server under load) wait for a CPU: the engine not
    # stepping is the cause to chase (its runbook points at the CPU panel), not the wait.
    "a stalled engine whose threads wait for CPU",
    (healthy(A, queued_while_idle_share=0.3, server_cpu_cores=0.5, server_cpu_wait=1.0),),
    file="system.yaml",
    place=6,
    fires={"InferenceQueuedWhileIdle": [queued_while_idle_on_a(idle=0.3, waiting=0)]},
    silent=("InferenceServerCPUStarved",),
)

SERVER_CPU_STARVED = Alert(
    name="InferenceServerCPUStarved",
    order=18,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    # A server that waits for its CPU steps, schedules, tokenizes and feeds its accelerator
    # late: every latency cause downstream of the CPU is this one's, as far as the wait
    # accounts for it (a thread that waits a share w of its ready time runs 1 / (1 - w) as
    # long; the runbook has the arithmetic).
    stretch="server_cpu_wait_share",
    explains=(
        "InferenceQueueingDelay",
        "InferencePrefillBottleneck",
        "InferenceDecodeBottleneck",
        "InferencePrefillStallsDecode",
        "InferenceGPUUnderutilized",
        *USERS_SEE,
    ),
    for_default="5m",
    summary="The server on {{ $labels.instance }} waits for CPU",
    description="The server's threads waited for a CPU "
    + value_of(
        "instance:inferwatch_server_cpu_wait_seconds:share_%(w)s",
        INSTANCE,
        "humanizePercentage",
        match_model=False,
    )
    + " of the time they were ready to run over %(window)s (threshold "
    '%(pct.server_cpu_wait_share)s) with {{ $value | printf "%%.3g" }} requests running: '
    "the server gets a share of the cores, not the cores. Node CPU pressure "
    + value_of(
        "rate(inferwatch_node_cpu_pressure_seconds_total[%(window)s])",
        INSTANCE,
        "humanizePercentage",
        match_model=False,
    )
    + "; the server's cgroup throttled "
    + value_of(
        "rate(inferwatch_server_cpu_throttled_seconds_total[%(window)s])",
        INSTANCE,
        PLAIN_NUMBER,
        match_model=False,
    )
    + " s per second.",
    # The server's work first: the alert carries the server's backend and model (the CPU
    # series carry the target's labels only), which its relations to the model's alerts need.
    # Requests in flight, not finishing: a starved server may finish almost none, and a
    # light load may average under one running request.
    when=(
        Cond("running", ">", 0),
        Cond("server_cpu_wait_share", ">", "server_cpu_wait_share"),
    ),
    # An engine that does not step while requests wait is InferenceQueuedWhileIdle's case,
    # whatever its other threads wait for (a busy-polling worker beside a stopped engine
    # waits for a CPU too); that runbook sends to the CPU panel.
    unless=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
    evidence=(
        "`stacks-dump.txt`: the server's threads in the scheduler or the tokenizer with "
        "nothing in between; `top -H` on the node shows who holds the cores."
    ),
    scenarios=(CPU_STARVED, CPU_WAIT_WITHOUT_TRAFFIC, STALL_WITH_CPU_WAIT),
)

# ---------------------------------------------------------------------------------------
# InferenceRouterOverhead

ROUTED = (Worker("http://10.0.0.1:8000"), Worker("http://10.0.0.2:8000"))
# The replicas' own requests take 1 s on average, all in (0.75, 1.12] s.
REPLICAS = tuple(healthy(i, request_seconds=Dist({TGI_LE[22]: 1.0}, 1.0)) for i in (A, B))


def _router_taking(mean: float, bucket: int) -> Router:
    """The router's answered requests, all in TGI_LE's ``bucket``, ``mean`` s on average."""
    return Router(ROUTER, ROUTED, duration=Dist({TGI_LE[bucket]: 1.0}, mean))


SLOW_ROUTER = Scenario(
    # The router takes 3 s per answered request where its replicas take 1 s: 2 s, two
    # thirds of what clients wait, is spent between the router and the replicas.
    "the router adds to every request",
    (_router_taking(3.0, 25), *REPLICAS),  # in (2.53, 3.79] s
    file="system.yaml",
    place=7,
    fires={"InferenceRouterOverhead": [instance_alert(ROUTER, backend=None, model=None, value=2)]},
)
ROUTER_NEAR_MISS = Scenario(
    # Near miss: 1.2 s against 1 s, a hop of 200 ms.
    "router near miss: a hop of 200 ms",
    (_router_taking(1.2, 23), *REPLICAS),  # in (1.12, 1.68] s
    file="system.yaml",
    place=8,
    fires={},
    silent=("InferenceRouterOverhead",),
)

ROUTER_OVERHEAD = Alert(
    name="InferenceRouterOverhead",
    order=25,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    for_default="10m",
    summary="The router behind {{ $labels.instance }} adds {{ $value | humanizeDuration }} to "
    "each request",
    description="The router behind {{ $labels.instance }} takes {{ $value | humanizeDuration "
    "}} more per answered request than the replicas of its namespace take themselves (means "
    "over the last %(window)s; threshold %(t.router_overhead_seconds)ss and "
    "%(pct.router_overhead_share)s of its time): retries and their backoff, the router's own "
    "queue, or the connection to the replicas. Faster replicas will not fix it.",
    when=(
        Cond("router_overhead", ">", "router_overhead_seconds"),
        Cond("router_overhead_share", ">", "router_overhead_share"),
    ),
    evidence=(
        "The router's retries panel beside its duration: retries rising with it are replicas "
        "failing first tries; without them, the router's own queue or its connections."
    ),
    scenarios=(SLOW_ROUTER, ROUTER_NEAR_MISS),
)

ALERTS = (FRONTEND_CPU_SATURATED, CLIENT_GAP, SERVER_CPU_STARVED, ROUTER_OVERHEAD)
