"""A real Triton server on CPU serving one slow Python model, for tests/test_real_triton.py.

Runs under the Python that has ``nvidia-pytriton`` (its wheel bundles ``tritonserver``):
``pytriton_tiny.py HTTP_PORT GRPC_PORT METRICS_PORT SECONDS_PER_EXECUTION``. The model
(``tiny``) runs in this process, one execution at a time with batching off, so concurrent
requests wait in Triton's queue; stopping this process (SIGSTOP) stalls the model while
Triton itself keeps serving its metrics.
"""

import os
import sys
import sysconfig
import time

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

# Triton's Python-backend stub links libpython dynamically: make it load this
# interpreter's library, not another build of the same version elsewhere on the system.
os.environ["LD_LIBRARY_PATH"] = ":".join(
    p for p in (sysconfig.get_config_var("LIBDIR"), os.environ.get("LD_LIBRARY_PATH")) if p
)

http_port, grpc_port, metrics_port = (int(p) for p in sys.argv[1:4])
seconds = float(sys.argv[4])


def infer(requests: list) -> list:
    time.sleep(seconds)
    return [{"y": request["x"] * 2} for request in requests]


config = TritonConfig(
    http_address="127.0.0.1",
    http_port=http_port,
    grpc_address="127.0.0.1",
    grpc_port=grpc_port,
    metrics_address="127.0.0.1",
    metrics_port=metrics_port,
    allow_metrics=True,
    allow_gpu_metrics=False,
    allow_cpu_metrics=False,
)
with Triton(config=config) as triton:
    triton.bind(
        model_name="tiny",
        infer_func=infer,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.serve()
