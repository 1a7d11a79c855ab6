"""The inference side of a worker: what runs in the one inference process.

``inference_process`` owns the model: it loads it (``worker``, ``sources``, ``download``, ``preload``),
queues and batches the HTTP processes' requests (``dataplane``, ``sweep``), runs generation
(``generation_engine``) and keeps the heap small (``heap``).  It never imports ``model_server.frontend``:
it talks to the HTTP processes only through the messages of ``model_server.ipc`` and the shared view
(``model_server.worker_view``), both at the top of ``model_server``
(tests/server/unit/test_layout.py).
"""
