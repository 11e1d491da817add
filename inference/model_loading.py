"""One process-wide lock that every loader of a transformers-based model holds while it imports and loads.

Written by hand because the problem sits between two libraries: transformers exposes its classes
through a lazy module whose first lookup of a name is not safe from two threads at once, and the node
loads its chat model and its embedder (sentence-transformers, itself built on transformers) in parallel
threads. The loser of that race fails with "cannot import name 'AutoModelForCausalLM' from
'transformers'" (seen on a fresh `zoo-node start` about one start in three). Python's import lock is
per module and does not cover the lazy lookup, so the loaders serialise on this lock instead; loading
both models one after the other costs a second or two of start-up, once.
"""

from __future__ import annotations

import threading

# Re-entrant: a loader may call another loader (a backend that builds its own tokenizer, say).
MODEL_LOADING = threading.RLock()
