"""modelpool-gateway: the pool's front door (OpenAI and KServe v2 routes, routed by model name).

It learns ModelPools and their serving worker pods from the API server by watches, picks the least
loaded serving worker of a pool, holds requests (bounded) for a pool that has no serving worker and
records that demand on the pool, and never queues without a bound.  No torch, no kopf: it imports
neither ``model_server`` nor ``modelpool_operator``.
"""

from modelpool_contract.version import VERSION

__version__ = VERSION
