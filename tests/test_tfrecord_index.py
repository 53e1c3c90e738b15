"""The offset index of TFRecord files: written by convert-tfrecord, built on first use, rebuilt
when stale; records read by index are the records; the image folder's listing cache."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
from PIL import Image

from hvd_train.base.errors import DataError
from hvd_train.data import images, tfrecords

SIZES = (9, 7)


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(0)
    for c, n in enumerate(SIZES):
        (tmp_path / "imgs" / f"class_{c}").mkdir(parents=True)
        for k in range(n):
            px = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            Image.fromarray(px).save(tmp_path / "imgs" / f"class_{c}" / f"img_{k}.png")
    return tmp_path / "imgs"


@pytest.fixture
def records_dir(folder: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    tfrecords.convert(str(folder), str(tmp_path / "tfr"), 2)
    return tmp_path / "tfr" / "train"


def test_convert_writes_an_index_in_dalis_format(records_dir) -> None:
    shards = sorted(records_dir.glob("*.tfrecord"))
    assert len(shards) == 2, sorted(p.name for p in records_dir.iterdir())  # convert(..., 2)
    for shard in shards:
        rows = [
            line.split() for line in (records_dir / f"{shard.name}.idx").read_text().splitlines()
        ]
        offsets = [int(o) for o, _ in rows]
        ends = [int(o) + int(s) for o, s in rows]
        assert offsets[0] == 0 and offsets[1:] == ends[:-1] and ends[-1] == shard.stat().st_size


def test_records_read_by_index_are_the_records(records_dir, folder) -> None:
    records = tfrecords.read_folder(str(records_dir), "data.train_dir")
    assert records.ids.tolist() == list(range(sum(SIZES)))
    assert records.labels.tolist() == [c for c, n in enumerate(SIZES) for _ in range(n)]
    assert records.checked.all()  # convert checked every image
    listed = [p for c in images.list_class_folders(str(folder), "x").files for p in c]
    for i in (0, 5, sum(SIZES) - 1):
        assert records.encoded(i) == pathlib.Path(listed[i]).read_bytes()
        assert records.name(i).endswith(f"({os.path.relpath(listed[i], folder)})")


def test_a_missing_or_stale_index_is_rebuilt(records_dir) -> None:
    want = tfrecords.read_folder(str(records_dir), "data.train_dir")
    shard = sorted(records_dir.glob("*.tfrecord"))[0]
    (records_dir / f"{shard.name}.labels").unlink()
    idx = records_dir / f"{shard.name}.idx"
    idx.write_text("0 10\n")  # ends before the file does: stale
    got = tfrecords.read_folder(str(records_dir), "data.train_dir")
    for field in ("offsets", "sizes", "labels", "ids", "file_of"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert got.checked.all()  # the images were checked while rebuilding
    assert (records_dir / f"{shard.name}.labels").exists() and len(idx.read_text().split()) > 2


def test_an_empty_file_holds_no_records_and_a_truncated_one_is_named(records_dir) -> None:
    (records_dir / "empty.tfrecord").write_bytes(b"")
    assert len(tfrecords.read_folder(str(records_dir), "data.train_dir").ids) == sum(SIZES)
    shard = sorted(records_dir.glob("train-*.tfrecord"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(DataError, match=f"{shard}: not a readable TFRecord file of images"):
        tfrecords.read_folder(str(records_dir), "data.train_dir")


def test_the_listing_is_cached_until_a_folder_changes(folder, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = images.list_class_folders(str(folder), "x")
    assert os.path.exists(images.listing_cache_path(str(folder)))
    monkeypatch.setattr(images, "images_under", lambda _: pytest.fail("listed again"))
    assert images.list_class_folders(str(folder), "x") == first
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / "class_1" / "new.png")
    again = images.list_class_folders(str(folder), "x")
    assert len(again.files[1]) == SIZES[1] + 1


def test_a_file_cut_short_or_rewritten_after_indexing_is_a_clear_error(records_dir) -> None:
    """What a job that keeps reading sees when a shard changes under it: truncated, a record
    read is cut short; rewritten with other records, a record no longer matches the index."""
    records = tfrecords.read_folder(str(records_dir), "data.train_dir")
    shards = sorted(records_dir.glob("*.tfrecord"))
    tfrecords.close_files()  # descriptors opened by earlier tests' reads of other folders
    last = int(np.argmax(records.offsets * (records.file_of == 0)))  # shard 0's last record
    os.truncate(shards[0], shards[0].stat().st_size - 1)
    with pytest.raises(DataError, match=r"is cut short \(\d+ of \d+ bytes\): the file is shorter"):
        records.read(last)
    other = np.flatnonzero(records.file_of == 1)
    second = int(other[np.argsort(records.offsets[other])][1])  # shard 1's second record
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[5:] + data[:5])  # the same size, records no longer where indexed
    with pytest.raises(DataError, match=r"does not match its index .*\(the file was rewritten\?\)"):
        records.read(second)


def test_a_file_written_in_place_while_read_is_a_clear_error_and_a_replaced_one_reads_on(
    records_dir,
) -> None:
    """A shard written in place after this worker began reading it, here with its very bytes
    (records the same sizes, its index true to the byte: no framing check could tell), is a
    clear error at the next read. A shard replaced by rename goes on being read as it was
    when the job opened it: exact, whatever the new file holds."""
    records = tfrecords.read_folder(str(records_dir), "data.train_dir")
    shards = sorted(records_dir.glob("*.tfrecord"))
    tfrecords.close_files()  # descriptors opened by earlier tests' reads of other folders
    for shard in shards[:2]:
        os.utime(shard, ns=(0, 0))  # written long ago: a write now is seen in its time
    first = [int(np.flatnonzero(records.file_of == k)[0]) for k in (0, 1)]
    before = [records.read(i) for i in first]  # both shards opened
    in_place = shards[0].read_bytes()
    with open(shards[0], "r+b") as f:
        f.write(in_place)
    with pytest.raises(DataError, match=r"was written while the job read it"):
        records.read(first[0])
    replacement = shards[1].with_name("replacement.tmp")
    replacement.write_bytes(b"\0" * shards[1].stat().st_size)
    os.replace(replacement, shards[1])
    assert records.read(first[1]) == before[1]
