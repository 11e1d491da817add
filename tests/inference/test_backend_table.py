"""The backend table: every name the config offers is in it, every entry names a class that is there, and
asking for one backend imports that one's stack alone (a llama.cpp node never imports torch)."""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from zoo.inference.backends import BACKENDS, backend_class
from zoo.node.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_has_every_backend_the_config_offers() -> None:
    # "auto" resolves to one of them; "none" is a light node, which loads no backend at all.
    offered = set(typing.get_args(ModelConfig.model_fields["backend"].annotation)) - {"auto", "none"}
    assert set(BACKENDS) == offered


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_entry_names_a_class_its_module_defines(name: str) -> None:
    module, _, attribute = BACKENDS[name].partition(":")
    parts = module.split(".")
    assert parts[0] == "zoo"
    source = ROOT.joinpath(*parts[1:]).with_suffix(".py")
    classes = {n.name for n in ast.parse(source.read_text()).body if isinstance(n, ast.ClassDef)}
    assert attribute in classes, f"{source} defines no class {attribute}"


def test_an_unknown_name_says_which_there_are() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope': one of llamacpp, transformers"):
        backend_class("nope")


def test_the_llamacpp_backend_comes_without_torch_or_transformers() -> None:
    code = (
        "import sys; from zoo.inference.backends import backend_class; backend_class('llamacpp');"
        "print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
