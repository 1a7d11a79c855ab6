"""modelpool-server: one model behind a bounded queue (KServe v2 + OpenAI-compatible HTTP APIs)."""

__version__ = "0.1.0"
