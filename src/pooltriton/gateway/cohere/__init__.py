"""Cohere's dialect: /v1/embed and /v2/embed."""
