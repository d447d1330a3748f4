"""The HTTP gateway: OpenAI-, Cohere- and vLLM-shaped routes in front of Triton, over the async client."""

from pooltriton.gateway.app import create_app

__all__ = ["create_app"]
