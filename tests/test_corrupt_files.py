"""Unreadable images: one error names them all (on every worker alike), convert-tfrecord says
what it skipped, and TFRecords written without them split exactly as the image folder does."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, horovodrun
from PIL import Image

from hvd_train.base.errors import DataError
from hvd_train.config import load_config
from hvd_train.data import images, sources, tfrecords

CLASS_SIZES = (37, 29, 41)
BAD = {0: [3, 10, 11, 30], 1: [0, 28], 2: [5, 6, 7, 8, 20, 40]}  # class -> file numbers


def write_folder(root: pathlib.Path, bad: dict[int, list[int]]) -> list[pathlib.Path]:
    """Tiny PNGs, a folder per class; the files numbered in `bad` are text named .png."""
    rng = np.random.default_rng(0)
    planted = []
    for c, n in enumerate(CLASS_SIZES):
        (root / f"class_{c}").mkdir(parents=True)
        for k in range(n):
            path = root / f"class_{c}" / f"img_{k:03d}.png"
            if k in bad.get(c, []):
                path.write_text("not an image")
                planted.append(path)
            else:
                Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).save(path)
    return planted


def folder_config(root: pathlib.Path, *overrides: str):
    return load_config(None, ["data.source=image_folder", f"data.train_dir={root}",
                              "data.validation_fraction=0.25", *overrides])  # fmt: skip


def test_on_corrupt_error_names_every_unreadable_file_up_to_a_cap(tmp_path) -> None:
    planted = write_folder(tmp_path / "imgs", {0: list(range(12)), 1: list(range(13))})  # 25
    with pytest.raises(DataError) as info:
        sources.select_folder(folder_config(tmp_path / "imgs"))
    lines = str(info.value).splitlines()
    assert lines[0] == (
        "data.train_dir: 25 files are not readable images; remove them, or set "
        "data.on_corrupt: skip:"
    )
    named = [line.split(": ")[0].strip() for line in lines[1:-1]]
    assert len(named) == images.SHOWN_BAD and set(named) <= set(map(str, planted))
    assert lines[-1] == f"  ... and {25 - images.SHOWN_BAD} more"


@pytest.mark.processes
def test_every_worker_stops_with_the_same_error_naming_all_files(tmp_path) -> None:
    planted = write_folder(tmp_path / "imgs", {0: [3], 2: [5]})
    proc = horovodrun(2, [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART),
                          "--set", "data.source=image_folder",
                          "--set", f"data.train_dir={tmp_path / 'imgs'}",
                          "--set", "data.image_size=[4,4]", "--set", "train.batch_size=4",
                          "--set", f"run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=240)  # fmt: skip
    assert proc.returncode != 0
    for rank in (0, 1):
        header = re.findall(rf"\[{rank}\]<stderr>:hvd_train: error: (.*)", proc.stderr)
        assert header == [
            "data.train_dir: 2 files are not readable images; remove them, or set "
            "data.on_corrupt: skip:"
        ], proc.stderr[-3000:]
        for path in planted:
            assert f"[{rank}]<stderr>:  {path}: not a JPEG or PNG image" in proc.stderr


def test_convert_error_names_the_bad_files_of_both_splits(tmp_path) -> None:
    write_folder(tmp_path / "train", {0: [1], 1: [2]})
    write_folder(tmp_path / "val", {2: [3]})
    with pytest.raises(DataError) as info:
        tfrecords.convert(str(tmp_path / "train"), str(tmp_path / "out"), 2, str(tmp_path / "val"))
    lines = str(info.value).splitlines()
    assert lines[0] == (
        "SRC_IMAGE_FOLDER, --val-dir: 3 files are not readable images; remove them, or use "
        "--on-corrupt skip:"
    )
    assert lines[1:] == [
        f"  {tmp_path / 'train' / 'class_0' / 'img_001.png'}: not a JPEG or PNG image",
        f"  {tmp_path / 'train' / 'class_1' / 'img_002.png'}: not a JPEG or PNG image",
        f"  {tmp_path / 'val' / 'class_2' / 'img_003.png'}: not a JPEG or PNG image",
    ]
    assert not (tmp_path / "out").exists()  # nothing written


def selected(sel: sources.Selection, names) -> tuple[list, list]:
    """(relative file, label) of the training and validation examples chosen."""
    return tuple(sorted((names(x), c) for x, c in part) for part in (sel.train, sel.val))


@pytest.mark.parametrize("caps", [[], ["data.max_train_per_class=20", "data.max_val_per_class=5"]])
def test_tfrecords_written_without_bad_files_split_as_the_folder_does(tmp_path, caps, capsys):
    src = tmp_path / "imgs"
    planted = write_folder(src, BAD)
    tfrecords.convert(str(src), str(tmp_path / "tfr"), 3, on_corrupt="skip")
    out = capsys.readouterr().out
    skipped_txt = tmp_path / "tfr" / "train" / "skipped.txt"
    assert (
        f"train: 95 images of 3 classes in 3 files, 12 corrupt files skipped (listed in {skipped_txt}):"
        in out
    )
    for path in planted:
        assert f"\n  {path}: not a JPEG or PNG image" in out

    folder = sources.select_folder(folder_config(src, "data.on_corrupt=skip", *caps))
    want = selected(folder, lambda p: str(pathlib.Path(p).relative_to(src)))
    records = tfrecords.read_folder(str(tmp_path / "tfr" / "train"), "data.train_dir")
    cfg = folder_config(tmp_path / "tfr" / "train", "data.source=tfrecord", *caps)
    relative = lambda i: re.search(r"\((.*)\)$", records.name(i)).group(1)  # noqa: E731
    got = selected(sources.select_records(cfg, records, None), relative)
    assert got == want
    assert want[1] and (caps or len(want[0]) + len(want[1]) == 95)  # every good image used

    # the listing in skipped.txt is what makes them equal: without it the split moves
    blind = records.__class__(**{**vars(records), "left_out": ()})
    assert selected(sources.select_records(cfg, blind, None), relative) != want
