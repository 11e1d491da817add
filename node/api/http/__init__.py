"""zoo.node.api.http: the OpenAI-compatible HTTP API, served beside gRPC.

/v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models run in the daemon's own process and
event loop (uvicorn on a socket the daemon binds) and share what gRPC uses: the inference engine, the
admission queue (node/api/admission.py), the validation rules (`validate_params`), the domain-error mapping
(`status_for`) and the metrics. What is zoo-specific travels in a `zoo` object: retrieval options in
requests, the experiences used and the timings in responses. Errors always have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}.

error_bodies.py maps failures to that shape, schemas.py parses request bodies, responses.py shapes answers,
routes.py implements the routes and server.py serves them.
"""
