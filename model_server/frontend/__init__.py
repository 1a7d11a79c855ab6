"""The HTTP side of a worker: what runs in each HTTP process.

An HTTP process (``http_process``) serves the KServe v2 and OpenAI-compatible routes (``endpoints/``),
decodes and encodes their bodies (``kserve_codec``, ``openai_codec``), takes a slot of the worker's
door and hands each request to the inference process over its channel (``inference_client``), then
streams the pieces back (``token_stream``).  It never imports the model nor ``model_server.engine``:
what it shares with the inference process (the wire messages, the shared view, the config, the
errors, the task definitions it validates against) lives at the top of ``model_server``
(tests/server/unit/test_layout.py).
"""
