"""The documentation builds (MkDocs, --strict: a broken link, a missing anchor or a page left out of the
navigation fails), every relative link of the README names a file that exists, and the configuration page
lists every key of the configuration's model with its default."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from zoo.node.config import NodeConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").glob("*.md")}
    built = {
        p.parent.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")
    }
    assert {("." if p == "index" else p) for p in pages} <= built


def test_the_readme_links_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?://)([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links to its docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def _config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, FieldInfo]]:
    """(section, key, field) of every key, sections (sub-models) walked recursively; top level is ""."""
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _config_keys(field.annotation, f"{prefix}{name}.")
        else:
            yield prefix.rstrip("."), name, field


def _dotted(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def _documented_keys(page: str) -> dict[tuple[str, str], str]:
    """(section, key) -> the default cell, from the tables under `## Top level` and `## `[section]`...`."""
    rows: dict[tuple[str, str], str] = {}
    section: str | None = None
    for line in page.splitlines():
        if line.startswith("## "):
            named = re.search(r"`\[([\w.]+)\]`", line)
            section = named.group(1) if named else ("" if line == "## Top level" else None)
        elif section is not None and (row := re.match(r"\| `(\w+)` \|", line)):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            assert len(cells) == 4, f"configuration.md: a row of four cells, not {line!r}"
            key = (section, row.group(1))
            assert key not in rows, f"configuration.md lists {_dotted(key)} twice"
            rows[key] = cells[2]
    return rows


def test_the_configuration_page_lists_every_key_with_its_default() -> None:
    documented = _documented_keys((ROOT / "docs" / "configuration.md").read_text())
    keys = {(section, name): field for section, name, field in _config_keys(NodeConfig)}
    missing = sorted(_dotted(k) for k in keys.keys() - documented.keys())
    assert not missing, f"docs/configuration.md lacks these keys of NodeConfig: {missing}"
    unknown = sorted(_dotted(k) for k in documented.keys() - keys.keys())
    assert not unknown, f"docs/configuration.md lists keys NodeConfig does not have: {unknown}"
    wrong = []
    for key, field in keys.items():
        cell = documented[key]
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
            if isinstance(default, Path):
                continue  # data_dir, cache_dir: from the environment, described in words
        else:
            default = field.default
        literal = re.search(r"`([^`]*)`", cell)
        if default is None:
            ok = cell.startswith("unset")
        else:
            ok = literal is not None and tomllib.loads(f"v = {literal.group(1)}")["v"] == default
        if not ok:
            wrong.append(f"{_dotted(key)}: page says {cell!r}, the model {default!r}")
    assert not wrong, "docs/configuration.md states other defaults than NodeConfig: " + "; ".join(wrong)
