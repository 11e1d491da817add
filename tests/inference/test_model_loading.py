"""Loading the chat model and the embedder in parallel threads, as the daemon does at start-up.

Each attempt runs in a fresh interpreter, because the race is in the first lookup of transformers'
lazily imported names: once any thread has resolved them, later loads cannot fail this way. Without
the shared loading lock about one attempt in three failed with "cannot import name
'AutoModelForCausalLM' from 'transformers'".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir

SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from zoo.inference.embedder import SentenceTransformerEmbedder
    from zoo.inference.transformers_backend import TransformersBackend

    errors = []
    barrier = threading.Barrier(2)

    def load(fn):
        barrier.wait()
        try:
            fn()
        except Exception as e:
            errors.append(repr(e))

    threads = [
        threading.Thread(target=load, args=(lambda: TransformersBackend.load(Path(sys.argv[1]), "m"),)),
        threading.Thread(target=load, args=(lambda: SentenceTransformerEmbedder(),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("\\n".join(errors) or "both loaded")
    sys.exit(1 if errors else 0)
    """
)


def test_chat_model_and_embedder_load_in_parallel_threads_of_a_fresh_process() -> None:
    path = prepare_bundled_chat_model(default_cache_dir()).path
    for attempt in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"attempt {attempt}: {proc.stdout}{proc.stderr[-2000:]}"
        assert proc.stdout.strip() == "both loaded"
