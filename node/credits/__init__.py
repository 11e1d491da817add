"""Contribute -> access: who sends a request (signed requests), what it used (metering), and credits.

Modules: signing (the EIP-712 request signature and its header), verifier (the node's check: signature,
freshness, single use), meter (durable per-epoch usage by author).
"""
