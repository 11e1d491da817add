"""zoo.node.api: the node's front doors. gRPC (grpc_server.py assembles it; interceptor.py authenticates,
admits and maps errors with status_codes.py; the servicers node_service.py, inference_service.py,
library_service.py, job_service.py translate proto to domain calls), admission.py (the queue both doors share)
and http/ (the OpenAI-compatible API). On top with the CLI: it may import zoo.node's components, jobs, credits
and p2p, and every layer below; they never import it.
"""
