"""zoo.node: the daemon, its CLI, config, job runner and p2p; wires every other layer together."""

__version__ = "0.1.0"
