"""YAML into a tree of typed, frozen dataclasses: the generic part of the config loader.

`load(cls, path, overrides)` reads a YAML file (bounded: size, values, depth), merges each
`--set a.b=value` override in order, and builds `cls`: every key must be a field (an unknown
one fails with a did-you-mean), every value is coerced to its field's type and checked
against the field's metadata (`min`, `min_exclusive`, `max`, `bool_as_int`, `executable`,
`aliases` for old names of a choice, `key` for a YAML key that is not the field's name, such
as `class`, `check` for a rule in the schema's own words, and `pattern`, the JSON Schema's
form of such a check). A field's type may be a section (a dataclass), a scalar, a `Literal`, a
list of integers, a list of sections (`tuple[Item, ...]`: each item a mapping, `items[i].key`
in messages) or `Mapping[str, Any]` (kept as a `FrozenMapping`). `expected` and `required`
give a field's own words for what it takes. Every leaf keeps the file or override it came
from, so an error names it with the dotted key.

`reference(cls)` writes the schema as Markdown tables: every key with its type, default,
allowed values and the comment the source puts beside its field (the comment lines right above
it and the one at the end of its line), so the reference is the code's own words. The JSON
Schema for editors (json_schema.py) walks the same fields through `described_fields`.

The schema (which sections and keys, their defaults) is in schema.py, the rules that span keys
in rules.py.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import math
import os
import re
import reprlib
import textwrap
import tokenize
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import yaml

from hvd_train.base.errors import ConfigError

T = TypeVar("T")

# A whole config is a few KB: a few hundred YAML values, 3 levels deep. Past these bounds it is
# the wrong file, or an attack: a "billion laughs" of nested aliases expands to 10^9 values
# (memory runs out before these bounds), and a huge file is slow to parse
# (docs/benchmarks.md, "Config loading bounds").
MAX_CONFIG_BYTES = 2**20  # the config file, checked before parsing
MAX_OVERRIDE_BYTES = 64 * 2**10  # one `--set key=value`; a path is at most 4 KB
MAX_YAML_VALUES = 10_000  # YAML nodes (keys, values, items) once every alias is expanded
MAX_YAML_DEPTH = 64  # nested collections (PyYAML's composer recurses once per level)
MAX_STRING = 4096  # a string value: a name or a path (Linux's PATH_MAX)


def load(cls: type[T], path: str | os.PathLike | None, overrides: typing.Sequence[str] = ()) -> T:
    """Reads a YAML file, applies `key=value` overrides and returns the frozen tree of `cls`.

    Args:
        cls: the frozen dataclass at the top of the tree.
        path: YAML file, or None for the defaults alone.
        overrides: `a.b=value` strings, applied in order; values are YAML scalars or lists.

    Raises:
        ConfigError: naming the file (or override), the dotted key and what was expected.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        tree = merge(tree, tag(_read_yaml(str(path)), str(path)))
    for item in overrides:
        source = f"--set {shorten(item)}"
        size = len(item.encode("utf-8", "surrogateescape"))
        if size > MAX_OVERRIDE_BYTES:
            raise ConfigError(
                f"{source}: {size} bytes, over the {MAX_OVERRIDE_BYTES // 2**10} KiB a --set may "
                "hold (a value is a number, a name, a path or a short list)"
            )
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}: expected key=value, for example train.epochs=5")
        parts = key.strip().split(".")
        if len(parts) > MAX_YAML_DEPTH:
            raise ConfigError(f"{source}: the key has more than {MAX_YAML_DEPTH} dotted parts")
        nested: Any = _parse_scalar(raw, source)
        for part in reversed(parts):
            nested = {part: nested}
        tree = merge(tree, tag(nested, source))
    return build(cls, tree, "", path_label(path))


def path_label(path: str | os.PathLike | None) -> str:
    return str(path) if path is not None else "<defaults>"


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)  # never more: the size is checked before parsing
            size = os.fstat(f.fileno()).st_size  # 0 for a pipe: `text` is what counts
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, expected a YAML config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
    if len(text) > MAX_CONFIG_BYTES:
        found = f"{size} bytes" if size > MAX_CONFIG_BYTES else "larger"
        raise ConfigError(
            f"{path}: {found}, over the {MAX_CONFIG_BYTES // 2**20} MiB a config file may hold "
            "(a config is a few KB); is this the right file?"
        )
    data = _load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top, got {kind(data)}")
    return data


def _parse_scalar(raw: str, source: str) -> Any:
    return _load_yaml(raw, source, one_value=True) if raw.strip() else ""


def _load_yaml(text: str | bytes, source: str, one_value: bool = False) -> Any:
    """yaml.safe_load within the bounds of `_BoundedLoader`; ConfigError naming `source` (and
    the line, in a file)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: plain data only
    except _TooBig as e:
        raise ConfigError(f"{source}{'' if one_value else f' (line {e.line})'}: {e}") from None
    except yaml.YAMLError as e:
        if one_value:
            raise ConfigError(f"{source}: the value is not valid YAML") from None
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}{line}: not valid YAML: {shorten(problem)}") from None


class _TooBig(Exception):
    """A YAML document past MAX_YAML_VALUES or MAX_YAML_DEPTH, at 1-based `line`."""

    def __init__(self, message: str, mark: Any):
        super().__init__(message)
        self.line = mark.line + 1


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that stops composing a document as soon as it holds more than
    MAX_YAML_VALUES values once its aliases are expanded, or nests deeper than MAX_YAML_DEPTH.

    Composing never copies an aliased node (`*a` is the same node object as `&a`), so the
    document stays small here; it is every walk of the result (ours, `repr`) that expands it.
    So the loader counts: 1 for each new node, and for each alias the expanded size of the node
    it names (summed from its children when that node was composed). A billion laughs stops
    after a few hundred nodes, a huge flat list after MAX_YAML_VALUES, both in milliseconds.
    """

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> its size with aliases expanded
        self._total = self._aliases = self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._expanded:  # still being composed: it holds itself
                raise _TooBig("an alias refers to the collection that holds it", mark)
            self._aliases += 1
            self._count(self._expanded[id(node)], mark)
            return node
        self._count(1, mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise _TooBig(f"nested deeper than {MAX_YAML_DEPTH} levels (a config has 3)", mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._expanded[id(node)] = 1 + sum(self._expanded[id(c)] for c in _children(node))
        return node

    def _count(self, values: int, mark: Any) -> None:
        self._total += values
        if self._total <= MAX_YAML_VALUES:
            return
        if self._aliases:
            raise _TooBig(
                f"more than {MAX_YAML_VALUES} values once its YAML aliases are expanded (a "
                'config has a few hundred): nested aliases multiply (a "billion laughs"); '
                "write the values out instead",
                mark,
            )
        raise _TooBig(
            f"more than {MAX_YAML_VALUES} values (a config has a few hundred); is this the "
            "right file?",
            mark,
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def shorten(text: str, limit: int = 80) -> str:
    """`text`, or its start and its length when longer than `limit`: error messages stay one
    readable line whatever a config holds."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def tag(tree: dict[str, Any], source: str) -> dict[str, Any]:
    """Wraps every leaf with the file or override it came from, for error messages."""
    return {
        k: tag(v, source) if isinstance(v, dict) else Sourced(v, source) for k, v in tree.items()
    }


@dataclass(frozen=True)
class Sourced:
    value: Any
    source: str


def untag(tree: dict[str, Any]) -> dict[str, Any]:
    """The plain values of a tagged tree: what a `Mapping[str, Any]` field keeps."""
    return {k: untag(v) if isinstance(v, dict) else v.value for k, v in tree.items()}


class FrozenMapping(Mapping):
    """A read-only dict: a `Mapping[str, Any]` field's value, so the tree stays frozen (and
    hashable where its values are, as a tuple of pairs was)."""

    def __init__(self, items: Any = ()) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._items!r})"


def build(cls: type[T], tree: Any, prefix: str, default_source: str) -> T:
    """`cls` from a tagged tree (see `tag`): every key known, every required key given, every
    value coerced to its field's type and range; ConfigError naming the source, the dotted key
    and what was expected."""
    if isinstance(tree, Sourced) and tree.value is None:  # `train:` with nothing under it
        tree = {}
    if isinstance(tree, Sourced) and isinstance(tree.value, dict):  # a section in a list's item
        tree = tag_keys(tree.value, tree.source)
    if isinstance(tree, Sourced):
        raise ConfigError(
            f"{tree.source}: {prefix.rstrip('.')}: expected {describe(cls)}, got {got(tree.value)}"
        )
    fields = yaml_fields(cls)
    for key in tree:
        if key not in fields:
            raise ConfigError(unknown_key(tree, key, prefix, fields, default_source))
    _check_required(tree, cls, prefix, first_source(tree, default_source))
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in tree.items():
        fld = fields[key]
        kwargs[fld.name] = _value(value, hints[fld.name], fld, f"{prefix}{key}", default_source)
    return cls(**kwargs)


def yaml_fields(cls: type) -> dict[Any, dataclasses.Field]:
    """The fields of dataclass `cls` by their YAML key (metadata `key`, else the name)."""
    return {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls)}


def tag_keys(mapping: dict[Any, Any], source: str) -> dict[Any, Sourced]:
    """One level of `tag`: inside a list, a value stays whole, so a message can show it."""
    return {k: Sourced(v, source) for k, v in mapping.items()}


def _check_required(tree: dict, cls: type, prefix: str, source: str) -> None:
    """Before any value: a list's item without its class is that, not a wrong `args`."""
    for key, fld in yaml_fields(cls).items():
        if key not in tree and _is_required(fld):
            tp = typing.get_type_hints(cls)[fld.name]
            what = fld.metadata.get("required") or expected(tp, fld)
            raise ConfigError(f"{source}: {prefix}{key}: required: {what}")


def _is_required(fld: dataclasses.Field) -> bool:
    return fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING


def _value(value: Any, tp: Any, fld: dataclasses.Field, path: str, default_source: str) -> Any:
    """One field's value from the tagged tree: a section, or a leaf coerced and checked."""
    if dataclasses.is_dataclass(tp):
        return build(tp, value, f"{path}.", default_source)
    if isinstance(value, dict):  # keys under a leaf: only a mapping field takes them
        source = first_source(value, default_source)
        if typing.get_origin(non_null(tp)[0]) is not Mapping:
            raise ConfigError(f"{source}: {path}: expected {expected(tp, fld)}, got a mapping")
        value = Sourced(untag(value), source)
    coerced = _coerce(value.value, tp, fld, path, value.source)
    problem = fld.metadata["check"](coerced) if "check" in fld.metadata else None
    if problem:  # a rule in the schema's words; the loader names the source and the key
        raise ConfigError(f"{value.source}: {path}: {problem}")
    return coerced


def first_source(tree: dict[str, Any], default: str) -> str:
    for v in tree.values():
        if isinstance(v, Sourced):
            return v.source
        if isinstance(v, dict):
            return first_source(v, default)
    return default


def unknown_key(tree: dict, key: str, prefix: str, fields: dict, default_source: str) -> str:
    value = tree[key]
    source = value.source if isinstance(value, Sourced) else first_source(value, default_source)
    key = shorten(str(key))  # a key may be any YAML scalar, of any length
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    hint = (
        f"; did you mean {prefix}{close[0]}?"
        if close
        else f"; known keys here: {', '.join(prefix + f for f in fields)}"
    )
    return f"{source}: {prefix}{key}: unknown key{hint}"


def _coerce(value: Any, tp: Any, fld: dataclasses.Field, path: str, source: str) -> Any:
    given, declared = value, tp

    def fail(wanted: str | None = None) -> ConfigError:
        wanted = wanted or expected(declared, fld)
        return ConfigError(f"{source}: {path}: expected {wanted}, got {got(given)}")

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:  # X | None
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        if isinstance(value, str) and value in fld.metadata.get("aliases", {}):
            value = fld.metadata["aliases"][value]  # an old name, kept working
        if isinstance(value, bool) and fld.metadata.get("bool_as_int"):
            value = int(value)  # an older config's true/false for a field that became a level
        if isinstance(value, bool) and "bool_as" in fld.metadata:
            value = fld.metadata["bool_as"][value]  # YAML reads `off` as false
        # By type too: `True in (0, 1)` and `1.0 in (0, 1)` hold in Python.
        if not any(value == a and type(value) is type(a) for a in args):
            bools = " (or true/false for 1/0)" if fld.metadata.get("bool_as_int") else ""
            raise fail(f"{expected(declared, fld)}{bools}")
        return value
    if origin is tuple and dataclasses.is_dataclass(args[0]):
        return _items(value, args[0], path, source, fail)
    if origin is Mapping:
        return _mapping(value, fail)
    if origin is tuple:
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise fail()
        if any(v < 1 for v in value):
            raise fail("a list of positive integers")
        return tuple(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise fail()
        return value
    if tp is int:
        if not _is_int(value):
            raise fail()
    elif tp is float:
        value = _as_float(value)
        if value is None:
            raise fail()
    elif tp is str:
        if not isinstance(value, str):
            raise fail()
        if len(value) > MAX_STRING:
            # A field that says what it takes says so for a long value too.
            raise fail(
                fld.metadata.get("expected")
                or f"a string of at most {MAX_STRING} characters (a name or a path)"
            )
        if fld.metadata.get("executable") and value and not ONE_PATH.fullmatch(value):
            raise fail(
                "the path of one executable (no spaces, arguments or shell syntax: put those "
                "inside the script)"
            )
        return value
    _check_range(value, fld, fail)
    return value


def _items(value: Any, item: type, path: str, source: str, fail: Any) -> tuple[Any, ...]:
    """A list of sections, each built as dataclass `item`; null is [], as a section's is {}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail()
    return tuple(_item(v, item, f"{path}[{i}]", source) for i, v in enumerate(value))


def _item(value: Any, cls: type, path: str, source: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {path}: expected {describe(cls)}, got {got(value)}")
    # Its keys in their declared order, whatever the YAML's: the first names the item (a
    # callback's class), so its error is the one to read first.
    ordered = {**{k: value[k] for k in yaml_fields(cls) if k in value}, **value}
    return build(cls, tag_keys(ordered, source), f"{path}.", source)


def _mapping(value: Any, fail: Any) -> FrozenMapping:
    """A `Mapping[str, Any]`: string keys, any values; null is {}."""
    if value is None:
        return FrozenMapping()
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise fail()
    return FrozenMapping(value)


_UNIONS = (typing.Union, types.UnionType)
# A path a shell reads as one plain word (shlex's safe characters): no spaces, quotes, `;`, `|`,
# `$`, backquotes, globs or `~`, so a config cannot smuggle a command into horovodrun's shell.
ONE_PATH = re.compile(r"[\w@%+=:,./-]+")


def non_null(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); any other type -> (it, False)."""
    if typing.get_origin(tp) in _UNIONS:
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):  # PyYAML reads 1e-3 (no dot) as a string
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _check_range(value: float, fld: dataclasses.Field, fail: Any) -> None:
    meta = fld.metadata
    if "min" in meta and value < meta["min"]:
        raise fail(f"a value >= {meta['min']}")
    if "min_exclusive" in meta and value <= meta["min_exclusive"]:
        raise fail(f"a value > {meta['min_exclusive']}")
    if "max" in meta and value > meta["max"]:
        raise fail(f"a value <= {meta['max']}")


def describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        inner = next(a for a in args if a is not type(None))
        return f"{describe(inner)} or null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        return "a list of mappings" if dataclasses.is_dataclass(args[0]) else "a list of integers"
    if origin is Mapping:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return describe_section(tp)
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[tp]


def describe_section(cls: type) -> str:
    """What a mapping of dataclass `cls`'s keys must hold, as an error says it."""
    keys = yaml_fields(cls)
    required = [k for k, f in keys.items() if _is_required(f)]
    if not required:
        return "a mapping of keys"
    optional = [k for k, f in keys.items() if not _is_required(f)]
    rest = f" (and optional {', '.join(optional)})" if optional else ""
    return f"a mapping with {', '.join(required)}{rest}"


def expected(tp: Any, fld: dataclasses.Field) -> str:
    """What field `fld` of type `tp` takes, in words: its metadata's `expected`, else its type's."""
    return fld.metadata.get("expected") or describe(tp)


def got(v: Any) -> str:
    return f"{SHORT_REPR.repr(v)} ({kind(v)})"


# repr that stops early: a value in an error message is never echoed whole (a 1 MB string, or
# a list whose items are aliases of one long string, would make a message of gigabytes).
SHORT_REPR = reprlib.Repr()
SHORT_REPR.maxstring = SHORT_REPR.maxother = 60
SHORT_REPR.maxlist = SHORT_REPR.maxdict = 6
SHORT_REPR.maxlevel = 3


def kind(v: Any) -> str:
    if v is None:
        return "null"
    return {dict: "a mapping", list: "a list", bool: "a boolean"}.get(type(v), type(v).__name__)


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The values a `Literal` field of dataclass `cls` allows, in their declared order."""
    tp = typing.get_type_hints(cls)[name]
    return typing.get_args(tp)


def get(tree: Any, dotted: str) -> Any:
    """`get(cfg, "train.batch_size")`; raises ConfigError for an unknown key."""
    node: Any = tree
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node) or not hasattr(node, part):
            raise ConfigError(f"{shorten(dotted)}: unknown key")
        node = getattr(node, part)
    return list(node) if isinstance(node, tuple) else node


def plain(tree: Any) -> dict[str, Any]:
    """The tree as plain YAML-able data (tuples become lists)."""

    def convert(v: Any) -> Any:
        if isinstance(v, (tuple, list)):  # a list of sections holds mappings
            return [convert(x) for x in v]
        if isinstance(v, Mapping):  # a dict, or a Mapping field's FrozenMapping
            return {k: convert(x) for k, x in v.items()}
        return v

    return convert(dataclasses.asdict(tree))


# --------------------------------------------------------------------------- reference


def reference(cls: type) -> str:
    """The schema under dataclass `cls` as Markdown: a section per field of `cls` (its
    docstring, then a table of its keys), each key with its type, default, allowed values and
    the comment beside it in the source."""
    hints = typing.get_type_hints(cls)
    parts = []
    for f in dataclasses.fields(cls):
        section = hints[f.name]
        if dataclasses.is_dataclass(section):
            parts.append(_section(f.name, section_doc(section), _keys(section, f"{f.name}.")))
        else:  # a key at the top, such as a list of items
            parts.append(_section(f.name, "", _keys(cls, "", only=f.name)))
    return "\n".join(parts)


def _section(name: str, doc: str, keys: list[Key]) -> str:
    intro = f"{doc}\n\n" if doc else ""
    rows = "".join(f"{_row(k)}\n" for k in keys)
    header = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n"
    return f"## `{name}`\n\n{intro}{header}{rows}"


@dataclass(frozen=True)
class Key:
    """One key of a schema, as its reference shows it."""

    path: str  # dotted, with `[i]` for an item of a list: callbacks[i].class
    type: str
    default: str  # as YAML writes it; "required" for a field without a default
    allowed: str  # the choices or bounds; "" when the type says it all
    doc: str  # the comment beside the field in the source


def _keys(cls: type, prefix: str, only: str | None = None) -> list[Key]:
    out = []
    for d in described_fields(cls):
        if only is not None and d.field.name != only:
            continue
        path = f"{prefix}{d.key}"
        if dataclasses.is_dataclass(d.type):
            out += _keys(d.type, f"{path}.")
            continue
        kind = _type_name(d.type)
        out.append(Key(path, kind, _default(d.field), _allowed(d.type, d.field), d.doc))
        item = item_class(d.type)
        if item is not None:
            out += _keys(item, f"{path}[i].")
    return out


@dataclass(frozen=True)
class Described:
    """One field of a schema dataclass, as docs/config.md and the JSON Schema describe it."""

    key: str  # the YAML key: the field's name, or its metadata's `key` (`class`)
    type: Any  # the field's type, resolved
    field: dataclasses.Field
    doc: str  # the comment beside the field in the source


def described_fields(cls: type) -> list[Described]:
    """The fields of dataclass `cls` in order, each with its YAML key, type and comment: the
    one walk of the schema that both references (Markdown and JSON Schema) make."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    return [
        Described(f.metadata.get("key", f.name), hints[f.name], f, comments.get(f.name, ""))
        for f in dataclasses.fields(cls)
    ]


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` -> its comment in the source: the comment lines right
    above the field and any comment at the end of its lines, joined into one line (formatter
    and linter pragmas left out)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {
        t.start[0]: t.string.lstrip("#").strip()
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    }
    body = ast.parse(source).body[0].body  # the class's statements
    out = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, n = [], node.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        text = " ".join(c for c in above + beside if not c.startswith(_PRAGMAS))
        out[node.target.id] = text
    return out


_PRAGMAS = ("fmt:", "noqa", "type:")


def section_doc(cls: type) -> str:
    """The docstring of dataclass `cls`, or "" when it has none of its own."""
    doc = cls.__dict__.get("__doc__") or ""
    # A dataclass without a docstring gets its signature as one: not a description.
    return "" if doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc)


def item_class(tp: Any) -> type | None:
    """The dataclass of a `tuple[Item, ...]` field's items, or None."""
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return item if dataclasses.is_dataclass(item) else None
    return None


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        inner = next(a for a in args if a is not type(None))
        return f"{_type_name(inner)} or null"
    if origin is Literal:
        return _type_name(type(args[0]))
    if origin is Mapping:
        return "mapping"
    if origin is tuple:
        item = args[0]
        return (
            "list of mappings" if dataclasses.is_dataclass(item) else f"list of {_type_name(item)}"
        )
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    value = default_of(f)
    return "required" if value is dataclasses.MISSING else yaml_value(value)


def default_of(f: dataclasses.Field) -> Any:
    """The field's default value (made by its factory if it has one); MISSING when required."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def yaml_value(value: Any) -> str:
    """`value` as YAML writes it on one line: `null`, `true`, `[32, 32]`, `''`."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, Mapping):
        value = dict(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf)
    return text.removesuffix("\n...\n").strip()


def _allowed(tp: Any, f: dataclasses.Field) -> str:
    """What the loader accepts beyond the type: the choices, the bounds, the old names."""
    meta, args = f.metadata, typing.get_args(tp)
    if typing.get_origin(tp) in _UNIONS:
        tp = next(a for a in args if a is not type(None))
        args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        text = ", ".join(f"`{yaml_value(a)}`" for a in args)
        if meta.get("bool_as_int"):
            text += " (`true`/`false`: `1`/`0`)"
        for old, new in meta.get("aliases", {}).items():
            text += f" (`{old}`: `{new}`'s old name)"
        return text
    if typing.get_origin(tp) is tuple and args[0] is int:
        return "integers >= 1"
    if meta.get("executable"):
        return "the path of one executable: no spaces, arguments or shell syntax"
    if "min" in meta and "max" in meta:
        return f"{yaml_value(meta['min'])} to {yaml_value(meta['max'])}"
    bounds = [f"{op} {yaml_value(meta[k])}" for k, op in _BOUNDS if k in meta]
    return " and ".join(bounds)


_BOUNDS = (("min", ">="), ("min_exclusive", ">"), ("max", "<="))


def _row(key: Key) -> str:
    cells = (f"`{key.path}`", key.type, f"`{key.default}`" if key.default != "required" else "required",
             key.allowed, key.doc)  # fmt: skip
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
