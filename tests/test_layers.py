"""The layers of hvd_train, as its folders show them, held by tests.

Each subpackage may import only the layers `LAYERS` puts under it; the launcher side, the
record, the config and the commands import without TensorFlow, Horovod or either Keras; and no
two modules import each other, through any path. Imports inside functions count too: a lazy
import hides a dependency from Python, not from the design.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.stack
PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hvd_train"

# Each layer, and the layers it may import (besides itself), from the floor up.
LAYERS: dict[str, set[str]] = {
    "base": set(),  # errors, logs, start-up marks, files, what is decided before TensorFlow loads (GPUs, device, XLA): the standard library only
    "config": {"base"},  # the schema, its loader and rules, the derived plan
    "record": {"base", "config"},  # run.dir, summary.json, the keeper, the stops
    "launcher": {"base", "config", "record"},  # horovodrun, launch, supervise, Slurm, sweep, plan
    "runtime": {"base", "config"},  # Horovod's state, core binding, speed knobs, Keras bindings
    "data": {"base", "config", "runtime"},  # sources, the job, each worker's slice, decoding
    "train": {"base", "config", "record", "runtime", "data"},  # the run and its parts
    "horovod": {"base", "config", "runtime"},  # Horovod's Keras API on Keras 3, for users' scripts
    "commands": {"base", "config", "record", "launcher", "runtime", "data", "train"},
}
# Layers that import without TensorFlow, Horovod or a Keras: the launchers read configs and
# records and start jobs in a second; the commands' modules load TensorFlow only when they run.
# Nor MLflow or wandb (a second of imports each): they load only where logging.mlflow or
# logging.wandb is on.
LIGHT = ("base", "config", "record", "launcher", "commands")
# Inside train, the same rule by folder, and the parts each may import: the model and its files
# at train's top (models, step, checkpoint, evaluation) import none of its folders; callbacks/
# (hvd_train's callbacks, the agreed stops among them, and the one list that orders them) the
# top; run/ (train(), from start to record) and inference/ (evaluate, predict, export,
# data-bench) the top and callbacks/, and not each other.
TRAIN_PARTS: dict[str, set[str]] = {
    "": set(),
    "callbacks": {""},
    "run": {"", "callbacks"},
    "inference": {"", "callbacks"},
}
TRAIN_TOP_MOST = 10  # modules and folders at train's top: a newcomer reads it at a glance
TRAIN_IMPORTS_DEEP_MOST = 6  # the longest chain of imports among train's modules
HEAVY = ("tensorflow", "horovod", "keras", "tf_keras", "mlflow", "wandb")


def modules() -> dict[str, pathlib.Path]:
    """Every module of hvd_train by dotted name; entry points (`__main__`) left out: nothing
    imports them."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(path: pathlib.Path, known: set[str]) -> set[str]:
    """The hvd_train modules `path` imports, anywhere in it (module level or in a function):
    `from hvd_train.x import y` imports module hvd_train.x.y when there is one, else hvd_train.x."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n == "hvd_train" or n.startswith("hvd_train."))
    return found


def layer_of(module: str) -> str | None:
    """`hvd_train.train.trainer` -> "train"; the package's top modules (cli) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {m: imports_of(p, known) & known - {m} for m, p in found.items()}


def train_part(module: str) -> str | None:
    """`hvd_train.train.run.trainer` -> "run"; `hvd_train.train.models` -> "" (train's top);
    None outside train."""
    parts = module.split(".")
    if parts[:2] != ["hvd_train", "train"] or len(parts) < 3:
        return None
    return parts[2] if len(parts) > 3 else ""


def train_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside train of a part that `TRAIN_PARTS` does not put under the importer."""
    bad = []
    for module, targets in sorted(graph.items()):
        part = train_part(module)
        for target in sorted(targets):
            other = train_part(target)
            if part is None or other is None or other == part:
                continue
            if other not in TRAIN_PARTS.get(part, set()):
                bad.append(f"{module} -> {target}")
    return bad


def imports_deep(graph: dict[str, set[str]], prefix: str) -> list[str]:
    """The longest chain of imports among the modules under `prefix` (no cycles: see below)."""
    inside = {m: {t for t in ts if t.startswith(prefix)} for m, ts in graph.items()
              if m.startswith(prefix)}  # fmt: skip
    longest: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in longest:
            longest[m] = [m, *max((chain(t) for t in inside.get(m, ())), key=len, default=[])]
        return longest[m]

    return max((chain(m) for m in inside), key=len, default=[])


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a layer from one that may not import it, as `a -> b`."""
    bad = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            continue  # cli.py, __init__.py: the package's top may import every layer
        for target in sorted(targets - {"hvd_train"}):  # the root: imported before any module
            other = layer_of(target)
            if other is None or (other != layer and other not in LAYERS[layer]):
                bad.append(f"{module} -> {target}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    through them: the first module, a path back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_through(graph, c) for c in components]


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to it, inside the component."""
    start, members = component[0], set(component)
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return [*path, start]
            if w not in path:
                paths.append([*path, w])
    raise AssertionError(f"no cycle through {component}")  # a component always has one


def test_the_layer_table_has_every_subpackage_and_no_loop() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"folders {sorted(folders)} vs LAYERS {sorted(LAYERS)}"
    assert cycles(LAYERS) == [], "the layers import each other in a loop"
    train = PACKAGE / "train"
    parts = {p.name for p in train.iterdir() if (p / "__init__.py").exists()} | {""}
    assert parts == set(TRAIN_PARTS), f"train's folders {sorted(parts)} vs TRAIN_PARTS"
    assert cycles(TRAIN_PARTS) == [], "train's parts import each other in a loop"
    top = sorted(p.name for p in train.iterdir() if p.suffix == ".py" or p.name in parts)
    assert len(top) <= TRAIN_TOP_MOST, top


def test_each_layer_imports_only_the_layers_under_it() -> None:
    graph = import_graph()
    bad = crossings(graph)
    assert not bad, "imports across the layer table (tests/test_layers.py LAYERS):\n" + "\n".join(
        bad
    )
    bad = train_crossings(graph)
    assert not bad, "imports across train's parts (TRAIN_PARTS):\n" + "\n".join(bad)
    deepest = imports_deep(graph, "hvd_train.train.")
    assert len(deepest) - 1 <= TRAIN_IMPORTS_DEEP_MOST, " -> ".join(deepest)


def test_the_crossing_finder_finds_a_crossing() -> None:
    graph = {
        "hvd_train.base.logs": {"hvd_train.train.trainer"},
        "hvd_train.train.trainer": {"hvd_train.base.logs", "hvd_train.config"},
        "hvd_train.cli": {"hvd_train.train.trainer"},
    }
    assert crossings(graph) == ["hvd_train.base.logs -> hvd_train.train.trainer"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lazy_imports_count(tmp_path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from hvd_train.train.trainer import train\n    import hvd_train.data.pipeline\n"
        "    from hvd_train.runtime import distributed\n"
    )
    known = {"hvd_train.train.trainer", "hvd_train.data.pipeline", "hvd_train.runtime.distributed"}
    assert imports_of(module, known) == known


def test_no_import_cycles_inside_hvd_train() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles inside hvd_train: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.processes
def test_the_light_layers_import_without_tensorflow_horovod_or_keras() -> None:
    """Every module of `LIGHT` (and cli.py), imported one after another in one fresh process
    in which importing TensorFlow, Horovod, Keras 3, tf_keras, MLflow or wandb fails."""
    light = [m for m in modules() if layer_of(m) in LIGHT or m == "hvd_train.cli"]
    script = (
        "import importlib, sys\n"
        f"for name in {HEAVY!r}:\n    sys.modules[name] = None\n"
        "failed = []\n"
        f"for module in {light!r}:\n"
        "    try:\n        importlib.import_module(module)\n"
        "    except ImportError as e:\n        failed.append(f'{module}: {e}')\n"
        "print('\\n'.join(failed))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", (
        "imported TensorFlow, Horovod, a Keras or MLflow:\n" + proc.stdout
    )
    assert len(light) > 30, light  # the test saw the modules it is about


def private_uses(path: pathlib.Path) -> list[str]:
    """Where `path` reaches for a private name of hvd_train: `from hvd_train.x import _y`, or
    `m._y` / `setattr(m, "_y", ...)` on a name it imported from hvd_train. Dunders are public."""
    tree = ast.parse(path.read_text(), str(path))
    bound: set[str] = set()  # names this file bound by importing from hvd_train
    found: list[str] = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvd_train"):
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names
                         if a.name.startswith("hvd_train"))  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"{path.name}:{node.lineno} uses {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "setattr" and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and node.args[0].id in bound
              and isinstance(node.args[1], ast.Constant) and private(str(node.args[1].value))):  # fmt: skip
            found.append(
                f"{path.name}:{node.lineno} patches {node.args[0].id}.{node.args[1].value}"
            )
    return sorted(found, key=lambda use: int(use.split(":")[1].split()[0]))


def test_tests_use_only_public_names_of_hvd_train() -> None:
    """A test pinned to a private name breaks when the code is reorganised without a change in
    behaviour; what a test needs is public."""
    tests = pathlib.Path(__file__).resolve().parent
    found = [use for path in sorted(tests.rglob("*.py")) for use in private_uses(path)]
    assert not found, "tests reaching into private names:\n" + "\n".join(found)


def test_the_private_name_finder_finds_each_kind(tmp_path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text(
        "import hvd_train.train.trainer as t\nfrom hvd_train.data import sources\n"
        "from hvd_train.base.errors import _hidden, DataError\n"
        "def test(monkeypatch):\n    t._lr_label()\n    sources.select_folder.__name__\n"
        "    monkeypatch.setattr(sources, '_cache', None)\n    DataError.__mro__\n"
    )
    assert private_uses(module) == [
        "test_x.py:3 imports hvd_train.base.errors._hidden",
        "test_x.py:5 uses t._lr_label",
        "test_x.py:7 patches sources._cache",
    ]
