"""Whether a library may put its experiences into this node's prompts: a library of format 4 names the
weights its experiences were made and validated on (`base_model_sha256`); a node serving other weights
answers without them, and says so (retrieval's status, the zoo_library_model_mismatch gauge, a warning).

Older libraries name their model by a string only, and a node whose weights it cannot hash (a remote
backend) cannot compare: both are used as before, and the status says the binding was not checked.
"""

from __future__ import annotations

from zoo.registry.library import Library


def binding_problem(library: Library, model_sha256: str) -> str | None:
    """Why `library`'s experiences stay out of prompts of the weights hashed `model_sha256`; None if they
    may go in."""
    wanted = library.base_model_sha256
    if not wanted or not model_sha256 or wanted == model_sha256:
        return None
    return (
        f"library version {library.version} was made for the model with sha256 {wanted[:16]}…, and this node "
        f"serves {model_sha256[:16]}…: its experiences stay out of prompts"
    )


def binding_note(library: Library, model_sha256: str) -> str:
    """A short status note on the binding: "" when it holds, or why it could not be checked."""
    if not library.base_model_sha256:
        return "; the library names its model by name only (format < 4): unchecked"
    if not model_sha256:
        return "; this node cannot hash its remote model: the library's model binding is unchecked"
    return ""
