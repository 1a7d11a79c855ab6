"""modelpool-server: one model behind a bounded queue (KServe v2 + OpenAI-compatible HTTP APIs)."""

from modelpool_contract.version import VERSION

__version__ = VERSION
