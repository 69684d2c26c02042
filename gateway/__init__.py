"""resumable-gateway: an OpenAI-compatible reverse proxy that makes LLM streams survive failure."""

__version__ = "0.1.0"
