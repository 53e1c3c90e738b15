"""typed_yaml on its own: a schema that is not hvd_train's loads, fails and aliases the same way."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import yaml

from hvd_train.base.errors import ConfigError
from hvd_train.config.typed_yaml import (
    FrozenMapping,
    choices,
    field_comments,
    get,
    load,
    plain,
    reference,
)


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


# A list of sections inside a section, and mappings of any values: what `callbacks:` and its
# items' `args` are, in a schema of a test's own.


@dataclass(frozen=True)
class Step:
    name: str  # required, with no words of its own: the message says its type
    opts: Mapping[str, Any] = FrozenMapping()
    inner: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()
    env: Mapping[str, Any] = FrozenMapping()


@dataclass(frozen=True)
class Top:
    plan: Plan = field(default_factory=Plan)


def test_a_list_of_sections_inside_a_section_builds_each_item(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "plan:\n  steps:\n  - {name: a, opts: {x: [1, 2]}, inner: {size: 4, kind: tiny}}\n"
        "  - {name: b, opts: null}\n"
    )
    steps = load(Top, tmp_path / "a.yaml").plan.steps
    assert steps == (Step("a", FrozenMapping({"x": [1, 2]}), Inner(4, "small")), Step("b"))
    assert dict(steps[1].opts) == {} and steps[1].inner == Inner()
    assert load(Top, None, ["plan.steps=null"]).plan.steps == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plan: {steps: [{name: a}, 3]}", "plan.steps[1]: expected a mapping with name (and optional opts, inner), got 3 (int)"),
        ("plan: {steps: [{opts: {}}]}", "plan.steps[0].name: required: a string"),
        ("plan: {steps: [{name: a, inner: {sise: 2}}]}", "plan.steps[0].inner.sise: unknown key; did you mean plan.steps[0].inner.size?"),
        ("plan: {steps: [{name: a, inner: {size: 0}}]}", "plan.steps[0].inner.size: expected a value >= 1, got 0 (int)"),
        ("plan: {steps: [{name: a, inner: 5}]}", "plan.steps[0].inner: expected a mapping of keys, got 5 (int)"),
        # Checked in the declared order, not the item's: the name's error comes first.
        ("plan: {steps: [{opts: [1], name: 5}]}", "plan.steps[0].name: expected a string, got 5 (int)"),
        ("plan: {steps: [{name: a, opts: [1]}]}", "plan.steps[0].opts: expected a mapping, got [1] (a list)"),
        ("plan: {steps: {name: a}}", "plan.steps: expected a list of mappings, got a mapping"),
        ("plan: {env: {1: x}}", "plan.env: expected a mapping, got {1: 'x'} (a mapping)"),
    ],
)  # fmt: skip
def test_an_item_s_error_names_the_file_and_its_index(text, message, tmp_path) -> None:
    (tmp_path / "a.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load(Top, tmp_path / "a.yaml")
    assert str(info.value) == f"{tmp_path / 'a.yaml'}: {message}"


def test_an_item_s_error_in_a_set_list_names_the_set() -> None:
    item = "plan.steps=[{name: a}, {nmae: b}]"
    with pytest.raises(ConfigError) as info:
        load(Top, None, [item])
    assert str(info.value) == (
        f"--set {item}: plan.steps[1].nmae: unknown key; did you mean plan.steps[1].name?"
    )


def test_a_mapping_field_merges_the_file_and_the_sets_and_stays_frozen(tmp_path) -> None:
    (tmp_path / "a.yaml").write_text("plan:\n  env: {A: 1, B: {c: [2]}}\n")
    tree = load(Top, tmp_path / "a.yaml", ["plan.env.A=3", "plan.env.D=x"])
    assert dict(tree.plan.env) == {"A": 3, "B": {"c": [2]}, "D": "x"}
    with pytest.raises(TypeError):
        tree.plan.env["A"] = 4  # type: ignore[index]
    assert load(Top, tmp_path / "a.yaml", ["plan.env=null"]).plan.env == {}
    assert hash(load(Top, None, ["plan.env={A: 1}"])) == hash(load(Top, None, ["plan.env.A=1"]))


def test_plain_gives_a_mapping_field_as_a_dict_yaml_can_write() -> None:
    tree = load(Top, None, ["plan.env={A: 1}", "plan.steps=[{name: a, opts: {k: v}}]"])
    data = plain(tree)
    assert type(data["plan"]["env"]) is dict and data["plan"]["steps"][0]["opts"] == {"k": "v"}
    assert yaml.safe_load(yaml.safe_dump(data)) == data


def test_the_reference_lists_an_item_s_keys_under_its_list() -> None:
    text = reference(Top)
    assert "| `plan.steps` | list of mappings | `[]` |  |  |" in text
    assert "| `plan.steps[i].name` | str | required |  | required, with no words" in text
    assert "| `plan.steps[i].inner.size` | int | `3` | >= 1 | how many |" in text
    assert "| `plan.env` | mapping | `{}` |  |  |" in text
