"""zoo.inference: bundled models, retrieval, prompt assembly, generation backends, expert factors.
Imports zoo.registry only; the trainer and the node build on it."""
