"""The scheduling layer: requests that wait, for capacity or for a stalled engine, and decode
steps that wait behind prefill chunks. One module per alert; ``workloads.py`` holds what
several of them expect."""
