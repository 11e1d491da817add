"""zoo.inference.provenance: what binds an answer to a model. The identity of a model's weights (their
SHA-256), computed once and cached."""
