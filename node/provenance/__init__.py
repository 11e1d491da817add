"""zoo.node.provenance: what binds this node's answers to its model: whether a library's experiences
belong in prompts of the weights it serves (binding)."""
