"""The CLI's rich consoles: stdout for results, stderr for progress and errors.

Printed to a pipe or a log file (not a terminal), lines are not wrapped at rich's default 80 columns:
wrapping there splits paths, roots and CIDs across lines, where scripts and `grep` no longer find them.
"""

from __future__ import annotations

import sys

from rich.console import Console


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=not stream.isatty())


out = _console(stderr=False)
err = _console(stderr=True)
