"""One run-directory layout (record/layout.py): the names of what a run writes in run.dir are
spelled there and nowhere else in hvd_train, and they are the names the docs promise."""

from __future__ import annotations

import ast
import pathlib
import re

from hvd_train.record import layout
from hvd_train.record.layout import RunDir

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hvd_train"
LAYOUT = PACKAGE / "record" / "layout.py"
# Names no string of hvd_train may hold, anywhere in it (an error message interpolates them).
SPELLED = re.compile(
    r"summary\.json|metrics\.csv|config\.yaml|model\.keras|best\.keras|timeline\.json"
    r"|evaluation\.json|\blog\.txt|state\.json|\.hvd_train\.(lock|reserve)|\bckpt[-.]"
    r"|\brank-|\.unloadable"
)
# Names too common to forbid in every string ("model" is a config section): forbidden as a
# part of a path, an argument of os.path.join (or tf.io.gfile.join, ...).
JOINED = {"model", "best", "checkpoints", "tensorboard", "logs", "ckpt", "log.txt"}
# Strings that are documentation and live below record in the layer table, where layout.py
# cannot be imported: the config reference's opening (docs/config.md) says where a run writes
# its config.
PROSE = {("config/reference.py", "config.yaml")}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spellings(source: str, where: str) -> list[str]:
    """`hvd_train/<where>:line: 'text'` for each string constant of the module `source` at
    `where` (f-strings' parts included, docstrings left out) that spells a name of run.dir."""
    tree = ast.parse(source, where)
    skip = docstrings(tree)
    joined = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join"
        for arg in node.args
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in skip:
            continue
        hits = {m.group(0) for m in SPELLED.finditer(node.value)}
        hits = {h for h in hits if (where, h) not in PROSE}
        if hits or (id(node) in joined and node.value in JOINED):
            found.append(f"hvd_train/{where}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_but_the_layout_spells_a_name_of_run_dir() -> None:
    found = [
        s
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != LAYOUT
        for s in spellings(p.read_text(), p.relative_to(PACKAGE).as_posix())
    ]
    assert not found, (
        "names of run.dir spelled outside hvd_train/record/layout.py (use RunDir or its "
        "constants):\n" + "\n".join(found)
    )


def test_the_scan_finds_a_spelled_name_and_leaves_docstrings_alone() -> None:
    source = (
        '"""Writes summary.json."""\n'
        "import os\n"
        "def f(d, rank):\n"
        '    """Into metrics.csv."""\n'
        '    a = os.path.join(d, "tensorboard")\n'
        '    b = f"{d}/logs/rank-{rank}.log"\n'
        '    c = {"model": 1}\n'
        '    return a, b, c, "no config.yaml here"\n'
    )
    found = spellings(source, "record/_scan_probe.py")
    assert found == [
        "hvd_train/record/_scan_probe.py:5: 'tensorboard'",
        "hvd_train/record/_scan_probe.py:6: '/logs/rank-'",
        "hvd_train/record/_scan_probe.py:8: 'no config.yaml here'",
    ], found


def test_the_layout_names_the_files_the_docs_promise() -> None:
    """The names are contracts (docs/faults.md, "What a run writes"): a change here is a
    change for every script that reads a run."""
    d = RunDir("/runs/r")
    assert (d.summary, d.metrics, d.config, d.timeline, d.evaluation, d.sweep_log) == (
        "/runs/r/summary.json", "/runs/r/metrics.csv", "/runs/r/config.yaml",
        "/runs/r/timeline.json", "/runs/r/evaluation.json", "/runs/r/log.txt",
    )  # fmt: skip
    assert (d.model, d.model_folder, d.best, d.best_folder) == (
        "/runs/r/model.keras",
        "/runs/r/model",
        "/runs/r/best.keras",
        "/runs/r/best",
    )
    assert d.checkpoint(22) == "/runs/r/checkpoints/ckpt-00000022"
    assert layout.CHECKPOINT_FOLDER.match("ckpt-00000022").group(1) == "00000022"
    assert not layout.CHECKPOINT_FOLDER.match("ckpt-00000022.unloadable")
    folder = d.checkpoint(22)
    assert layout.checkpoint_state(folder) == f"{folder}/state.json"
    assert layout.checkpoint_index(folder) == f"{folder}/ckpt.index"
    assert (d.tensorboard, d.rank_log(3), d.lock, d.reserve) == (
        "/runs/r/tensorboard", "/runs/r/logs/rank-3.log", "/runs/r/.hvd_train.lock",
        "/runs/r/.hvd_train.reserve",
    )  # fmt: skip


def test_a_run_s_files_are_every_name_the_layout_gives_at_the_top_of_run_dir() -> None:
    """rundir's allow-list (what makes a folder an earlier run's) is the layout's top level."""
    assert layout.RUN_FILES == {
        "summary.json", "metrics.csv", "config.yaml", "checkpoints", "model.keras", "model",
        "best.keras", "best", "model.weights.h5", "best.weights.h5", "tensorboard",
        "timeline.json", "logs", "log.txt",
        ".hvd_train.lock", "evaluation.json", ".hvd_train.reserve", "export",
    }  # fmt: skip
