"""InferenceReplicaImbalance: one replica queues while another of the same model has room."""

from __future__ import annotations

import dataclasses

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, value_of
from inferwatch.method.scenario import A, B, C, Scenario, healthy, instance_alert
from inferwatch.method.signals import INSTANCE

# A hot: 12 running and 6 waiting all along; B: 2 running, nothing waiting.
HOT = healthy(A, running=(12,), waiting=(6,))
COLD = healthy(B, running=(2,), waiting=(0,))

ONE_HOT = Scenario(
    # The router sends A nine requests in ten: A queues while B has room.
    "imbalance: one replica queues while another has room",
    (HOT, COLD),
    file="scheduling.yaml",
    place=7,
    fires={"InferenceReplicaImbalance": [instance_alert(A, value=9, queries=(6,))]},
)
BOTH_BUSY = Scenario(
    # Near miss: both replicas hold as much, both queue: the fleet lacks capacity.
    "imbalance near miss: every replica queues alike",
    (HOT, healthy(B, running=(12,), waiting=(6,))),
    file="scheduling.yaml",
    place=8,
    fires={},
    silent=("InferenceReplicaImbalance",),
)
ALL_QUEUE_ONE_MORE = Scenario(
    # Near miss: A holds seven times B's requests, but B queues too (2 waiting): no replica
    # has room, the fleet lacks capacity (a slower replica behind round robin gathers the
    # clients that wait on it, so the load spreads unevenly once every replica queues).
    "imbalance near miss: every replica queues, one far more",
    (healthy(A, running=(12,), waiting=(30,)), healthy(B, running=(4,), waiting=(2,))),
    file="scheduling.yaml",
    place=15,
    fires={},
    silent=("InferenceReplicaImbalance",),
)
UNEVEN_NO_QUEUE = Scenario(
    # Near miss: A holds five times B's requests but nothing waits on it.
    "imbalance near miss: uneven, but no queue",
    (healthy(A, running=(10,), waiting=(0,)), COLD),
    file="scheduling.yaml",
    place=9,
    fires={},
    silent=("InferenceReplicaImbalance",),
)

WITHIN_A_ROLE = Scenario(
    # Disaggregated: prefill instances A (hot) and B, decode instance C nearly idle. A is
    # compared with B, the least loaded of its role: 18 in flight against 2, not C's 1.
    "imbalance within a role: one prefill instance queues while another has room",
    (
        dataclasses.replace(HOT, role="prefill"),
        dataclasses.replace(COLD, role="prefill"),
        healthy(C, role="decode", running=(1,), waiting=(0,)),
    ),
    file="scheduling.yaml",
    place=13,
    fires={"InferenceReplicaImbalance": [instance_alert(A, value=9, queries=(6,))]},
)
ROLES_APART = Scenario(
    # Near miss: a prefill instance holds nine times its decode instance's requests; their
    # work differs, so they are not compared.
    "imbalance near miss: a prefill instance busier than the decode one",
    (dataclasses.replace(HOT, role="prefill"), dataclasses.replace(COLD, role="decode")),
    file="scheduling.yaml",
    place=14,
    fires={},
    silent=("InferenceReplicaImbalance",),
)

REPLICA_IMBALANCE = Alert(
    name="InferenceReplicaImbalance",
    order=24,
    severity="warning",
    level=INSTANCE,
    phase="prefill",
    layer="scheduling",
    explains=("InferenceQueueingDelay", *USERS_SEE),
    for_default="5m",
    summary="{{ $labels.instance }} holds far more requests than another replica of "
    "{{ $labels.model }}",
    description="{{ $labels.instance }} holds {{ $value | humanize }}x the requests in flight "
    "of the least loaded replica of {{ $labels.model }} over the last %(window)s "
    "(threshold %(t.replica_imbalance_factor)sx), with "
    + value_of(
        "sum without (engine) (avg_over_time(inferwatch_requests_waiting[%(window)s]))",
        INSTANCE,
        PLAIN_NUMBER,
    )
    + " waiting on it: the router's policy or an affinity sends it the load while another "
    "replica has room. Adding replicas will not help.",
    when=(
        Cond("load_over_least_loaded", ">", "replica_imbalance_factor"),
        Cond("waiting", ">=", 1),
        Cond("least_waiting", "<", 1),
    ),
    # A replica whose engine idles with a queue is stalled, not sent too much: its queue
    # grows whatever the router does (InferenceQueuedWhileIdle, InferenceEngineHung).
    unless=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
    scenarios=(ONE_HOT, BOTH_BUSY, ALL_QUEUE_ONE_MORE, UNEVEN_NO_QUEUE, WITHIN_A_ROLE, ROLES_APART),
)

ALERTS = (REPLICA_IMBALANCE,)
