"""Atomic files (base/files.py): the target is whole, old or new, whatever the writer does, and
what was written reaches the disk before and after the rename."""

from __future__ import annotations

import fnmatch
import os
import pathlib
import stat

import pytest

from hvd_train.base import files
from hvd_train.base.files import atomic_path, atomic_write


class Boom(Exception):
    pass


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")
    with atomic_write(str(target)) as f:
        f.write("new")
        assert target.read_text() == "old"  # not yet: the rename comes when the block ends
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["summary.json"]


@pytest.mark.parametrize("before", ["old", None], ids=["over_a_file", "no_file"])
def test_a_writer_that_raises_leaves_the_target_as_it_was(tmp_path, before) -> None:
    target = tmp_path / "metrics.json"
    if before is not None:
        target.write_text(before)
    with pytest.raises(Boom), atomic_write(str(target), "wb") as f:
        f.write(b"half of the new")
        raise Boom
    assert (target.read_text() if target.exists() else None) == before
    assert os.listdir(tmp_path) == ([] if before is None else ["metrics.json"])


def test_a_folder_replaces_a_folder_whole(tmp_path) -> None:
    """A checkpoint or SavedModel folder written at its temporary path: the old folder's files
    are gone, the new ones in place, no aside or temporary left."""
    target = tmp_path / "model"
    (target / "variables").mkdir(parents=True)
    (target / "variables" / "old.index").write_text("old")
    with atomic_path(str(target)) as tmp:
        pathlib.Path(tmp, "variables").mkdir(parents=True)
        pathlib.Path(tmp, "variables", "new.index").write_text("new")
        pathlib.Path(tmp, "saved_model.pb").write_text("pb")
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "saved_model.pb", "variables", "variables/new.index"
    ]  # fmt: skip
    assert os.listdir(tmp_path) == ["model"]


def test_a_folder_writer_that_raises_leaves_the_old_folder(tmp_path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "state.json").write_text("old")
    with pytest.raises(Boom), atomic_path(str(target)) as tmp:
        os.makedirs(tmp)
        pathlib.Path(tmp, "state.json").write_text("half")
        raise Boom
    assert (target / "state.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["ckpt"]


def test_a_hidden_temporary_is_out_of_a_listing_by_prefix(tmp_path) -> None:
    """A checkpoint folder being written is not among checkpoints/ckpt-*, nor the one it
    replaces while set aside."""
    folder = tmp_path / "checkpoints"
    old = folder / "ckpt-00000022"
    old.mkdir(parents=True)
    with atomic_path(str(old), hidden=True) as tmp:
        os.makedirs(tmp)
        pathlib.Path(tmp, "state.json").write_text("new")
        assert [p.name for p in folder.glob("ckpt-*")] == ["ckpt-00000022"]
        assert os.path.basename(tmp).startswith(".tmp-ckpt-00000022-"), tmp
    assert (old / "state.json").read_text() == "new"
    assert os.listdir(folder) == ["ckpt-00000022"]


def test_a_keras_path_keeps_its_suffix_and_the_folder_is_created(tmp_path) -> None:
    """Keras' model.save insists on a path ending in .keras."""
    target = tmp_path / "new" / "best.keras"
    with atomic_path(str(target)) as tmp:
        assert tmp.endswith(".keras") and os.path.dirname(tmp) == str(target.parent), tmp
        pathlib.Path(tmp).write_text("model")
    assert target.read_text() == "model"


def test_the_file_and_then_its_folder_are_fsynced(tmp_path, monkeypatch) -> None:
    """Each os.fsync call recorded as (inode, is a folder): the new file's data is synced before
    the rename, its folder (holding the rename) after."""
    synced = record_fsyncs(monkeypatch)
    target = tmp_path / "config.yaml"
    with atomic_write(str(target)) as f:
        f.write("train: {}\n")
    assert synced == [(target.stat().st_ino, False), (tmp_path.stat().st_ino, True)]


def test_every_file_of_a_folder_is_fsynced_before_the_rename(tmp_path, monkeypatch) -> None:
    synced = record_fsyncs(monkeypatch)
    target = tmp_path / "ckpt-00000001"
    with atomic_path(str(target)) as tmp:
        os.makedirs(os.path.join(tmp, "sub"))
        for name in ("ckpt.index", "state.json", "sub/part"):
            pathlib.Path(tmp, name).write_text(name)
    written = [target / "ckpt.index", target / "state.json", target / "sub" / "part"]
    folders = [target / "sub", target, tmp_path]  # each folder after its files; run.dir last
    assert {(p.stat().st_ino, False) for p in written} <= set(synced)
    assert [i for i, is_folder in synced if is_folder] == [p.stat().st_ino for p in folders]
    assert synced[-1] == (tmp_path.stat().st_ino, True)


def test_a_killed_writers_temporaries_are_recognised_as_leftovers(tmp_path) -> None:
    """What a process killed inside the block leaves (its temporary file, a `.keras` one, a
    hidden one, a folder set aside) is what the next job's cleanup deletes (is_leftover) and
    what run.dir's claim accepts as a run's (TEMPORARY_PATTERNS); other names are neither
    deleted nor taken for an atomic write's."""
    left = [
        os.path.basename(files.temporary_path(str(tmp_path / name)))
        for name in ("summary.json", "model.keras", "model", ".hvd_train.lock")
    ]
    left.append(os.path.basename(files.temporary_path(str(tmp_path / "ckpt-00000044"), True)))
    # As earlier versions named them too.
    left += ["model.old-4242", "best.tmp-4242.keras", ".tmp-ckpt-00000044-4242"]
    for name in left:
        assert files.is_leftover(name), name
        assert any(fnmatch.fnmatch(name, p) for p in files.TEMPORARY_PATTERNS), name
    for name in ("summary.json", "model.keras", "notes.tmp", "ckpt-00000044", "x.tmp-1.csv"):
        assert not files.is_leftover(name), name


def record_fsyncs(monkeypatch) -> list[tuple[int, bool]]:
    synced: list[tuple[int, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_ino, stat.S_ISDIR(st.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
