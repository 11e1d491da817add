"""The Nano environment's two tools: their descriptions for the model, and apply_patch itself.

- shell(cmd): `bash -c cmd` with the clone as working directory, run by the environment through
  isolated_commands.py: a per-call timeout after which the whole process group is killed with SIGKILL
  (anything the command left running in the background is killed after every call too), stdout and
  stderr together cut to the first and last halves of `output_chars` characters with a
  `[... output truncated: N characters omitted ...]` marker, and the exit code reported. The environment
  is built from scratch (PATH with this interpreter's directory first, HOME and TMPDIR in the episode's
  directory outside the clone, a UTF-8 locale, no .pyc files), so no variable of the trainer (keys,
  tokens, proxies) reaches the command.
- apply_patch(path, old_content, new_content): a literal search and replace. The path (relative to the
  clone, or absolute) is resolved with every symlink, parents included, and must land inside the clone
  and outside `.git`. `old_content` must occur exactly once (overlapping occurrences count); 0 or several
  occurrences is an error naming the count. An empty `old_content` creates a missing file (parent
  directories too) or fills an empty one; on a non-empty file it is an error. Every problem comes back
  as a tool result starting with "Error:"; nothing the model does raises.
"""

from __future__ import annotations

from pathlib import Path

from zoo.trainer.envs.tool_calls import ToolParameter, ToolSpec

SHELL_TOOL = ToolSpec(
    name="shell",
    description="Run a bash command in the repository (no network). Returns the exit code and output.",
    parameters=(ToolParameter("cmd", "string", "the bash command line"),),
)
APPLY_PATCH_TOOL = ToolSpec(
    name="apply_patch",
    description=(
        "Edit a file: replace old_content, which must occur exactly once in the file, with new_content. "
        "An empty old_content creates a new file."
    ),
    parameters=(
        ToolParameter("path", "string", "file path relative to the repository root"),
        ToolParameter("old_content", "string", "exact text to replace (unique in the file)"),
        ToolParameter("new_content", "string", "the replacement text"),
    ),
)
TOOLS: tuple[ToolSpec, ...] = (SHELL_TOOL, APPLY_PATCH_TOOL)


def _occurrences(text: str, part: str) -> int:
    count, index = 0, text.find(part)
    while index != -1:
        count += 1
        index = text.find(part, index + 1)
    return count


def _lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def apply_patch(root: Path, path: str, old_content: str, new_content: str) -> str:
    """Replace the single occurrence of old_content in root/path; returns the tool result text."""
    root = root.resolve()
    if not path.strip() or "\x00" in path:
        return "Error: path is empty or invalid."
    try:
        target = (root / path).resolve()
    except (OSError, RuntimeError) as exc:
        return f"Error: cannot resolve {path!r}: {exc}"
    if not target.is_relative_to(root):
        return f"Error: {path!r} is outside the repository; only files inside it can be edited."
    relative = target.relative_to(root)
    if not relative.parts:
        return f"Error: {path!r} is the repository itself, not a file."
    if relative.parts[0] == ".git":
        return f"Error: {path!r} is inside .git; edit the working tree only."
    shown = relative.as_posix()
    try:
        if target.is_dir():
            return f"Error: {shown} is a directory."
        if not target.exists():
            if old_content:
                return (
                    f"Error: {shown} does not exist. To create it, call apply_patch with an empty "
                    "old_content and the file's text as new_content."
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(new_content.encode("utf-8"))
            return f"Created {shown} ({_lines(new_content)} lines)."
        try:
            text = target.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return f"Error: {shown} is not a UTF-8 text file."
        if not old_content:
            if text:
                return (
                    f"Error: old_content is empty but {shown} is not; give a piece of the file that occurs "
                    "exactly once (an empty old_content only creates a file or fills an empty one)."
                )
            target.write_bytes(new_content.encode("utf-8"))
            return f"Wrote {shown} ({_lines(new_content)} lines)."
        count = _occurrences(text, old_content)
        if count == 0:
            return f"Error: old_content was not found in {shown}; it must match the file exactly."
        if count > 1:
            return (
                f"Error: old_content occurs {count} times in {shown}; include more surrounding lines so "
                "that it occurs exactly once."
            )
        target.write_bytes(text.replace(old_content, new_content, 1).encode("utf-8"))
    except OSError as exc:
        return f"Error: cannot edit {shown}: {exc.strerror or exc}"
    return f"Edited {shown}: replaced {_lines(old_content)} line(s) with {_lines(new_content)} line(s)."
