"""zoo.node.components: the daemon's long-running parts (what one is: zoo.node.lifecycle) and their
supervisor (supervisor.py), the health probes of chain, IPFS and model (probes.py), the model's backend
from its config (backends.py), the verified library kept in step with the chain (library.py), the inference
engine's wiring to them (inference.py) and the daemon's components built from its configuration
(wiring.py). Below the front doors: it may import zoo.node's config, metrics, logs and credits, and every
layer below; never zoo.node.api or zoo.node.cli.
"""
