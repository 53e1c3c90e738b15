"""typed_yaml on its own: a schema that is not hvd_train's loads, fails and aliases the same way."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Literal

import pytest

from hvd_train.base.errors import ConfigError
from hvd_train.config.typed_yaml import choices, field_comments, get, load, reference


@dataclass(frozen=True)
class Inner:
    """The inner section."""

    size: int = field(default=3, metadata={"min": 1})  # how many
    # The kind of thing;
    # tiny is its old name.
    kind: Literal["small", "large"] = field(
        default="small", metadata={"aliases": {"tiny": "small"}}
    )  # fmt: skip


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


def test_a_field_s_comment_is_the_lines_above_it_and_the_one_beside_it() -> None:
    assert field_comments(Inner) == {
        "size": "how many",
        "kind": "The kind of thing; tiny is its old name.",  # the formatter's pragma left out
    }


def test_the_reference_shows_each_key_s_type_default_bounds_and_comment() -> None:
    text = reference(Outer)
    assert (
        "## `inner`\n\nThe inner section.\n\n| key | type | default | allowed | meaning |" in text
    )
    assert "| `inner.size` | int | `3` | >= 1 | how many |" in text
    assert (
        "| `inner.kind` | str | `small` | `small`, `large` (`tiny`: `small`'s old name) | "
        "The kind of thing; tiny is its old name. |"
    ) in text
    assert "## `name`\n\n| key | type | default | allowed | meaning |" in text
    assert "| `name` | str | `x` |  |  |" in text
