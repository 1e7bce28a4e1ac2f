"""Imported first by the front and meta models' shims: JAX in their stubs runs on the CPU.

Every stub of a worker inherits the worker's ``CUDA_VISIBLE_DEVICES`` (its GPU), but only the
runtime model computes on it. A front or meta hook that imports JAX would otherwise open a CUDA
context on that GPU and reserve device memory there (docs/deployment.md, "GPUs and workers").
Importing this module sets ``JAX_PLATFORMS=cpu`` before anything imports JAX; the runtime's stub
never imports it, so it keeps the GPU.
"""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
