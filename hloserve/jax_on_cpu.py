"""Imported first by the front and meta models' shims: sets ``JAX_PLATFORMS=cpu`` so a hook's JAX
opens no CUDA context on the worker's GPU, which only the runtime computes on (docs/deployment.md,
"GPUs and workers").
"""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
