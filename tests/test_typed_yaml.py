"""typed_yaml on its own: a schema that is not hvd_train's loads, fails and aliases the same way."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Literal

import pytest

from hvd_train.errors import ConfigError
from hvd_train.typed_yaml import choices, get, load


@dataclass(frozen=True)
class Inner:
    size: int = field(default=3, metadata={"min": 1})
    kind: Literal["small", "large"] = field(
        default="small", metadata={"aliases": {"tiny": "small"}}
    )


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    name: str = "x"


def test_file_then_overrides_in_order(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.yaml").write_text("inner:\n  size: 5\nname: y\n")
    tree = load(Outer, tmp_path / "a.yaml", ["inner.size=7", "inner.kind=tiny"])
    assert tree == Outer(Inner(7, "small"), "y")
    assert get(tree, "inner.size") == 7


def test_unknown_key_names_the_file_and_the_dotted_path(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.yaml").write_text("inner:\n  sise: 5\n")
    with pytest.raises(ConfigError) as info:
        load(Outer, tmp_path / "a.yaml")
    assert (
        str(info.value)
        == f"{tmp_path / 'a.yaml'}: inner.sise: unknown key; did you mean inner.size?"
    )


def test_values_are_checked_against_type_and_range() -> None:
    with pytest.raises(ConfigError, match=r"--set inner.size=0: inner.size: expected a value >= 1"):
        load(Outer, None, ["inner.size=0"])
    with pytest.raises(ConfigError, match=r"expected one of 'small', 'large', got 'huge'"):
        load(Outer, None, ["inner.kind=huge"])


def test_choices_are_the_literals_values() -> None:
    assert choices(Inner, "kind") == ("small", "large")
