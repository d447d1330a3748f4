"""pooltriton: pooling models (embed, classify, token tasks, scoring) on NVIDIA Triton Inference Server.

Layers, each a folder importing only those before it (docs/architecture.md): core -> contract ->
export -> backends (runs inside Triton) -> server -> client -> gateway; cli.py on top.
"""
