"""pooltriton: pooling models on Triton."""
