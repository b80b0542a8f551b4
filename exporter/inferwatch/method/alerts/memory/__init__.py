"""The memory layer: decode against the memory-bandwidth floor, and the KV cache. One module
per alert.

Decode reads every weight and the KV cache each step: its floor is the weights' bytes over
the GPU's memory bandwidth.
"""
