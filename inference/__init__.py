"""zoo.inference: bundled models, retrieval, prompt assembly, generation backends, expert factors."""
