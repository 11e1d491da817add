"""zoo.node: the daemon and what it wires: api (the front doors), cli, components, jobs, credits, p2p. It
may import every other layer; inside it only cli and the daemon import api (tests/test_layers.py)."""

__version__ = "0.1.0"
