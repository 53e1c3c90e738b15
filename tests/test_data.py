"""Image sources end to end: image folders and TFRecords built at test time from the digits.

Real jobs throughout: `python -m hvd_train` for one worker, horovodrun (Gloo) for 2 and 3.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import time

import numpy as np
import pytest
from harness import BIN, PYTHON, QUICKSTART, WORKERS, check, finish, horovodrun, run, start
from PIL import Image

from hvd_train.train.checkpoint import read_state

pytestmark = pytest.mark.multiworker

DIGITS_VAL = 359  # round(0.2 x 1,797): divides by neither 2 nor 3
ID_CLASS_SIZES = (23, 31, 17, 26)


# --------------------------------------------------------------------------- datasets


def write_digits(root: pathlib.Path) -> pathlib.Path:
    """The 1,797 shipped digits as 16x16 class folders: JPEG and PNG; grey, RGB and RGBA;
    a few at other sizes (resized on decode)."""
    from hvd_train.data import digits

    images, labels = digits.load()
    for i, (img, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / f"digit_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        im = Image.fromarray((img * 255 / 16).astype(np.uint8)).resize((16, 16))
        if i % 50 == 0:
            im = im.resize((20, 12) if i % 100 else (8, 8))
        kind = i % 4
        if kind == 0:
            im.save(folder / f"{i:04d}.png")
        elif kind == 1:
            im.convert("RGB").save(folder / f"{i:04d}.jpg", quality=95)
        elif kind == 2:
            im.convert("RGBA").save(folder / f"{i:04d}.png")
        else:
            im.save(folder / f"{i:04d}.jpeg", quality=95)
    (root / "digit_0" / "notes.txt").write_text("not an image, and not named like one: ignored")
    return root


def write_id_images(root: pathlib.Path) -> pathlib.Path:
    """Small PNGs whose pixel (0, 0) encodes the image's id as red * 256 + green."""
    rng = np.random.default_rng(0)
    next_id = 0
    for c, n in enumerate(ID_CLASS_SIZES):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for _ in range(n):
            px = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
            px[0, 0, :2] = divmod(next_id, 256)
            Image.fromarray(px).save(folder / f"img_{next_id:03d}.png")
            next_id += 1
    return root


def plant_corrupt(folder: pathlib.Path) -> list[pathlib.Path]:
    """Three bad files with image names: text, a truncated JPEG, an empty PNG."""
    text = folder / "digit_3" / "bad_text.jpg"
    text.write_text("this is not a JPEG")
    whole = next((folder / "digit_5").glob("*.jpg")).read_bytes()
    truncated = folder / "digit_5" / "truncated.jpg"
    truncated.write_bytes(whole[: len(whole) // 2])
    empty = folder / "digit_7" / "empty.png"
    empty.write_bytes(b"")
    return [text, truncated, empty]


def convert(src: pathlib.Path, dst: pathlib.Path, shards: int, cwd: pathlib.Path, *extra: str):
    return run([PYTHON, "-m", "hvd_train", "convert-tfrecord", str(src), str(dst),
                "--shards", str(shards), *extra], cwd)  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("data")
    paths = {
        "root": root,
        "digits": write_digits(root / "digits"),
        "ids": write_id_images(root / "ids"),
    }
    paths["convert_digits"] = check(convert(paths["digits"], root / "digits_tfr", 3, root))
    paths["convert_ids"] = check(convert(paths["ids"], root / "ids_tfr", 1, root))
    # Fewer files than workers, and an empty one (its index is built on first use).
    (root / "ids_tfr" / "train" / "zz-empty.tfrecord").write_bytes(b"")
    return paths


def read_metrics(run_dir: pathlib.Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


TRAIN_SET = [
    "data.image_size=[16,16]", "data.channels=1", "train.epochs=2", "train.batch_size=32",
    "optimizer.name=adam", "optimizer.learning_rate=0.002", "model.dense_units=[64]",
    "train.verbose=false", "logging.tensorboard=false", "optimizer.warmup_epochs=0",
]  # fmt: skip


def train_args(*sets: str) -> list[str]:
    """`-m hvd_train --config quickstart.yaml --set ...`: TRAIN_SET, then `sets`."""
    overrides = [a for s in [*TRAIN_SET, *sets] for a in ("--set", s)]
    return ["-m", "hvd_train", "--config", str(QUICKSTART), *overrides]


@pytest.fixture(scope="module")
def tfrecord_run(data) -> tuple[pathlib.Path, str]:
    """2 workers train from the converted digits; 1,438 examples do not divide by 64."""
    out = data["root"] / "tfrecord_run"
    proc = check(horovodrun(2, [PYTHON, *train_args(
        "data.source=tfrecord", f"data.train_dir={data['root'] / 'digits_tfr' / 'train'}",
        "data.remainder=pad_by_repeat", f"run.dir={out}",
    )], cwd=data["root"]))  # fmt: skip
    return out, proc.stdout


# --------------------------------------------------------------------------- conversion, training


@pytest.mark.processes
def test_convert_tfrecord_writes_shards_and_class_names(data) -> None:
    train = data["root"] / "digits_tfr" / "train"
    shards = sorted(p.name for p in train.glob("*.tfrecord"))
    assert shards == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    names = (train / "classes.txt").read_text().split()
    assert names == [f"digit_{i}" for i in range(10)]
    out = data["convert_digits"].stdout
    assert "train: 1797 images of 10 classes in 3 files" in out, out
    assert f"train_dir: {train}" in out
    assert "1797/1797" in data["convert_digits"].stderr  # the progress bar reached the end


@pytest.mark.processes
def test_ctrl_c_in_the_middle_of_a_batch_read_stops_then_resumes_to_the_end(data, tmp_path):
    """Ctrl-C to horovodrun while a worker's input pipeline is inside a batch's record reads
    (one read held for 2 s by tests/workers/slow_phase.py): the workers agree on the stop as
    after any Ctrl-C. The record says `interrupted`, a stop checkpoint is where it
    says the next run continues, and the same command then trains to the end."""
    d, marker = tmp_path / "run", tmp_path / "read-begun"
    sets = ["data.source=tfrecord", f"data.train_dir={data['root'] / 'digits_tfr' / 'train'}",
            f"run.dir={d}"]  # fmt: skip
    program = [PYTHON, str(WORKERS / "slow_phase.py"), "read", *train_args(*sets)[2:]]
    os.environ["SLOW_PHASE_MARKER"] = str(marker)
    try:
        proc = start([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                      *program], tmp_path)  # fmt: skip
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no read was held"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        result = finish(proc, 60)
    finally:
        del os.environ["SLOW_PHASE_MARKER"]
    s = json.loads((d / "summary.json").read_text())
    # horovodrun passes a Ctrl-C on to its workers as SIGTERM
    assert s["status"] == "interrupted" and s["stopped_by"] == "SIGTERM", (s, result.stderr)
    if s.get("stopped_at") and "nothing to save" not in s.get("stop_detail", ""):
        state = read_state(s["last_checkpoint"])
        assert [state["epoch"] + 1, state["step"]] == [
            s["stopped_at"]["epoch"],
            s["stopped_at"]["step"],
        ], (s, state)
    check(horovodrun(2, [PYTHON, *train_args(*sets)], cwd=tmp_path))
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "completed" and s["epochs_completed"] == 2, s


@pytest.mark.processes
def test_training_from_tfrecord_pads_the_remainder_and_reports_input_wait(tfrecord_run) -> None:
    out, stdout = tfrecord_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps_per_epoch"] == 23  # ceil(1,438 / 64): the last batch padded
    assert "1438 training examples (34 repeated per epoch, data.remainder: pad_by_repeat)" in stdout
    assert "tfrecord" in stdout and "1438 training and 359 validation images" in stdout
    rows = read_metrics(out)
    assert "input_wait_fraction" in rows[0]
    waits = [float(r["input_wait_fraction"]) for r in rows]
    assert all(0 <= w <= 1 for w in waits), waits
    assert summary["input_wait_fraction"] == pytest.approx(waits[-1], rel=1e-4)
    assert summary["skipped_files"] == []
    assert summary["final_metrics"]["val_accuracy"] > 0.8, summary["final_metrics"]


# --------------------------------------------------------------------------- exactness


@pytest.fixture(scope="module")
def exactness_runs(data, tfrecord_run) -> dict[int, str]:
    """The same worker script alone, at 2 and at 3 workers."""
    args = [str(WORKERS / "data_exactness.py"), str(data["ids"]),
            str(data["root"] / "ids_tfr" / "train"), str(data["digits"]),
            str(tfrecord_run[0] / "model.keras")]  # fmt: skip
    outputs = {1: check(run([PYTHON, *args], data["root"])).stdout}
    for n in (2, 3):
        outputs[n] = check(horovodrun(n, [PYTHON, *args], data["root"])).stdout
    return outputs


@pytest.mark.processes
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_example_goes_to_one_worker_with_equal_steps(exactness_runs, workers) -> None:
    """Checked on rank 0 of the job (data_exactness.py asserts, and prints only on success):
    ids counted per epoch on 97 images (no multiple of any global batch), from an image folder
    and from 1 TFRecord file plus an empty one (fewer files than workers); a resume in the
    middle of an epoch continues the same order."""
    checked = re.findall(r"exact (\S+) at (\d) workers: \d+ steps/epoch", exactness_runs[workers])
    assert sorted(checked) == [
        (f"{source}/{remainder}", str(workers))
        for source in ("image_folder", "tfrecord")
        for remainder in ("drop", "pad_by_repeat")
    ], exactness_runs[workers]


@pytest.mark.processes
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_stream_gives_every_worker_the_same_full_steps(exactness_runs, workers) -> None:
    """data.read: stream, on 1 file of records plus an empty one (fewer than the workers)."""
    checked = re.findall(r"stream (\S+) at (\d) workers: \d+ steps/epoch", exactness_runs[workers])
    assert sorted(checked) == [
        (f"{source}/stream", str(workers)) for source in ("image_folder", "tfrecord")
    ], exactness_runs[workers]


@pytest.mark.processes
def test_validation_metrics_are_equal_at_1_2_and_3_workers(exactness_runs) -> None:
    evals = {}
    for workers, out in exactness_runs.items():
        line = re.search(r"eval (\{.*\})", out)
        assert line, out
        evals[workers] = json.loads(line.group(1))
    assert {e["val_examples"] for e in evals.values()} == {DIGITS_VAL}
    for n in (2, 3):
        assert evals[n]["val_loss"] == pytest.approx(evals[1]["val_loss"], rel=1e-5), evals
        assert evals[n]["val_accuracy"] == pytest.approx(evals[1]["val_accuracy"], abs=1e-9)
    assert evals[1]["val_accuracy"] > 0.8, evals


# --------------------------------------------------------------------------- skip, diagnostics


@pytest.mark.processes
def test_corrupt_files_are_skipped_and_counted_and_input_wait_is_recorded(data, tmp_path) -> None:
    """One run with planted corrupt files and on_corrupt: skip. Its input wait is recorded, in
    [0, 1]; how it is measured and when it warns is tested on controlled clocks in
    test_input_diagnostics.py.

    With `data.input_wait_warning: 0` the warning and its advice for image folders must appear,
    whatever the load: a step's wait is at least the time from Keras' batch-begin hook to the
    fetch inside the compiled step (a call from Python into TensorFlow: tens of microseconds on
    any machine, and only longer on a loaded one), so an epoch's fraction is above 0.
    """
    folder = tmp_path / "digits"
    for cls in data["digits"].iterdir():
        (folder / cls.name).mkdir(parents=True)
        for f in cls.iterdir():
            (folder / cls.name / f.name).symlink_to(f)
    planted = plant_corrupt(folder)
    proc = check(run([PYTHON, *train_args(
        "data.source=image_folder", f"data.train_dir={folder}", "data.on_corrupt=skip",
        "model.name=mlp", "model.dense_units=[4]", "data.input_wait_warning=0",
        "train.epochs=2", "train.steps_per_epoch=15", f"run.dir={tmp_path / 'out'}",
    )], tmp_path))  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert sorted(summary["skipped_files"]) == sorted(map(str, planted))
    assert "3 corrupt files were skipped (data.on_corrupt: skip)" in proc.stdout
    waits = [float(r["input_wait_fraction"]) for r in read_metrics(tmp_path / "out")]
    assert len(waits) == 2 and all(0 <= w <= 1 for w in waits), waits
    assert summary["input_wait_fraction"] == pytest.approx(waits[1], rel=1e-4)  # epoch 1: warm-up
    assert "warning: epoch 2 spent" in proc.stdout, proc.stdout[-3000:]
    assert "data.cache: memory" in proc.stdout  # the advice for decoded images


@pytest.mark.processes
def test_data_bench_prints_input_and_model_rates(data, tmp_path) -> None:
    proc = check(run([PYTHON, "-m", "hvd_train", "data-bench", "--config", str(QUICKSTART),
                      "--batches", "10",
                      "--set", "data.source=image_folder", "--set", f"data.train_dir={data['digits']}",
                      "--set", "data.image_size=[16,16]", "--set", "data.channels=1"], tmp_path))  # fmt: skip
    m = re.search(
        r"input pipeline (\d+) examples/s per worker \| model consumes (\d+) examples/s per "
        r"worker \| ratio ([0-9.]+): (not )?input-bound",
        proc.stdout,
    )
    assert m, proc.stdout
    assert int(m.group(1)) > 0 and int(m.group(2)) > 0
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]  # Keras' on the ignored shuffle


# --------------------------------------------------------------------------- bad input


def bad_inputs(root: pathlib.Path, digits: pathlib.Path) -> dict[str, tuple[list[str], str]]:
    """name -> (--set overrides, the expected error line)."""
    (root / "empty").mkdir()
    no_images = root / "no_images"
    (no_images / "cat").mkdir(parents=True)
    (no_images / "dog").mkdir()
    Image.new("RGB", (4, 4)).save(no_images / "cat" / "a.png")
    (no_images / "dog" / "readme.txt").write_text("no images here")
    corrupt = root / "corrupt"
    (corrupt / "a").mkdir(parents=True)
    (corrupt / "b").mkdir()
    for i in range(4):
        Image.new("L", (4, 4), i).save(corrupt / "a" / f"{i}.png")
        Image.new("RGB", (4, 4)).save(corrupt / "b" / f"{i}.jpg")
    (corrupt / "b" / "2.jpg").write_text("plain text, named .jpg")
    other_classes = root / "other_classes"
    (other_classes / "digit_0").mkdir(parents=True)
    Image.new("L", (4, 4)).save(other_classes / "digit_0" / "x.png")
    folder = ["data.source=image_folder"]
    return {
        "missing folder": (
            [*folder, f"data.train_dir={root / 'nope'}"],
            f"data.train_dir: folder {root / 'nope'} does not exist",
        ),
        "empty folder": (
            [*folder, f"data.train_dir={root / 'empty'}"],
            f"data.train_dir: folder {root / 'empty'} has no class sub-folders; expected one "
            "sub-folder of .jpg/.jpeg/.png images per class",
        ),
        "class without images": (
            [*folder, f"data.train_dir={no_images}"],
            f"data.train_dir: class folder {no_images / 'dog'} has no .jpg, .jpeg or .png "
            "images; add some or remove the folder",
        ),
        "non-image file": (
            [*folder, f"data.train_dir={corrupt}"],
            f"data.train_dir: {corrupt / 'b' / '2.jpg'}: not a JPEG or PNG image; remove it, "
            "or set data.on_corrupt: skip",
        ),
        "too few examples": (
            [*folder, f"data.train_dir={digits}", "train.batch_size=2000"],
            "data: 1438 training examples are fewer than one global batch of 2000 (1 workers x "
            "2000); lower train.batch_size",
        ),
        "validation classes differ": (
            [*folder, f"data.train_dir={digits}", f"data.val_dir={other_classes}"],
            None,  # checked by prefix below: the message lists the classes
        ),
        "no tfrecords": (
            ["data.source=tfrecord", f"data.train_dir={root / 'empty'}"],
            f"data.train_dir: folder {root / 'empty'} has no .tfrecord files; write them with "
            "hvd-train convert-tfrecord SRC_IMAGE_FOLDER DST",
        ),
    }


BAD_CASES = ["missing folder", "empty folder", "class without images", "non-image file",
             "too few examples", "validation classes differ", "no tfrecords"]  # fmt: skip


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory, data) -> tuple[pathlib.Path, dict]:
    root = tmp_path_factory.mktemp("bad")
    return root, bad_inputs(root, data["digits"])


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hvd_train: error:")]


@pytest.mark.processes
@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_exits_2_naming_the_file_or_folder(bad_root, case) -> None:
    root, cases = bad_root
    overrides, expected = cases[case]
    proc = run([PYTHON, *train_args(*overrides)], root, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    if expected is None:
        assert lines[0].startswith(f"hvd_train: error: data.val_dir: {root / 'other_classes'} has "
                                   "classes ['digit_0'], but data.train_dir has"), lines  # fmt: skip
    else:
        assert lines == [f"hvd_train: error: {expected}"]


@pytest.mark.processes
def test_convert_stops_at_a_corrupt_file_unless_told_to_skip(bad_root) -> None:
    root, _ = bad_root
    proc = convert(root / "corrupt", root / "out", 2, root)
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        f"hvd_train: error: SRC_IMAGE_FOLDER: {root / 'corrupt' / 'b' / '2.jpg'}: not a JPEG or "
        "PNG image; remove it, or use --on-corrupt skip"
    ]
    skipped = check(convert(root / "corrupt", root / "out", 2, root, "--on-corrupt", "skip"))
    assert "train: 7 images of 2 classes in 2 files, 1 corrupt files skipped" in skipped.stdout


# --------------------------------------------------------------------------- config rules


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.source=image_folder"], "data.train_dir: data.source image_folder needs the folder of training data; set data.train_dir"),
        (["data.source=tfrecord", "data.train_dir=x", "data.channels=4"], "data.channels: expected 1 (grey) or 3 (RGB) for data.source tfrecord, got 4"),
        (["data.source=image_folder", "data.train_dir=x", "data.image_size=[32]"], "data.image_size: expected [height, width] for data.source image_folder, got [32]"),
    ],
)  # fmt: skip
def test_image_source_config_rules(overrides: list[str], message: str) -> None:
    from hvd_train.base.errors import ConfigError
    from hvd_train.config import check, load_config

    with pytest.raises(ConfigError) as info:
        check(load_config(None, overrides), world_size=2)
    assert str(info.value) == message


@pytest.mark.processes
def test_file_urls_go_through_gfile_and_read_what_local_paths_read(data) -> None:
    """`file://` takes the code for gs:// and s3:// (tf.io.gfile listing, GFile reads)."""
    proc = check(run([PYTHON, str(WORKERS / "gfile_paths.py"), str(data["ids"]),
                      str(data["root"] / "ids_tfr" / "train")], data["root"]))  # fmt: skip
    assert "gfile image_folder:" in proc.stdout and "gfile tfrecord:" in proc.stdout, proc.stdout


def test_the_shipped_digits_are_the_uci_test_set_scikit_learn_ships() -> None:
    """The quickstart's digits come from the file hvd_train ships, byte for byte scikit-learn's
    digits.csv.gz (1.5.2): 1,797 8x8 images of whole pixel counts 0 to 16, 174 to 183 of each
    digit, read into the types `load_digits` gives (float64 images, int64 labels)."""
    from hvd_train.data import digits

    sha256 = hashlib.sha256(pathlib.Path(digits.PATH).read_bytes()).hexdigest()
    assert sha256 == "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    images, labels = digits.load()
    assert images.shape == (1797, 8, 8) and images.dtype == np.float64
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert images.min() == 0 and images.max() == 16 and np.all(images == np.round(images))
    counts = np.bincount(labels, minlength=10).tolist()
    assert counts == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@pytest.mark.processes
def test_a_shard_cut_short_under_a_running_job_ends_it_with_a_data_error(data, tmp_path) -> None:
    """A hostile trial of the batched reader: a TFRecord file truncated while 2 workers read it
    ends the job with one line naming the file (exit code 2, summary.json `failed`), never a
    silently shorter epoch. (Renamed over, the job reads the file it opened to the end.) Both
    ranks read that file: the record holds rank 0's own error, or, when rank 1 met the cut first
    and horovodrun ended rank 0 before it did, that rank 1 ended first with exit code 2."""
    shutil.copytree(data["root"] / "digits_tfr", tmp_path / "tfr")
    d = tmp_path / "run"
    proc = start([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON,
                  *train_args("data.source=tfrecord", f"data.train_dir={tmp_path / 'tfr' / 'train'}",
                              "data.cache=none", "train.epochs=40",
                              f"run.dir={d}")], tmp_path)  # fmt: skip
    deadline = time.monotonic() + 240
    while not (d / "metrics.csv").exists():  # epoch 1 done: the workers are reading
        assert proc.poll() is None and time.monotonic() < deadline, "no first epoch"
        time.sleep(0.1)
    shard = sorted((tmp_path / "tfr" / "train").glob("*.tfrecord"))[0]
    os.truncate(shard, shard.stat().st_size // 2)
    result = finish(proc, 240)
    assert result.returncode == 2, result.stderr[-3000:]  # the worker's, passed on by horovodrun
    said = [ln for ln in result.stderr.splitlines() if "] failed: " in ln and str(shard) in ln]
    assert said and all("is cut short" in ln for ln in said), result.stderr[-3000:]
    first = re.match(r"horovodrun: process (\d) exited first, with code 2, and ended the job",
                     result.stderr.splitlines()[-1])  # fmt: skip
    assert first, result.stderr[-600:]
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "failed" and s["epochs_completed"] < 40, s
    if first.group(1) == "0" or "error_type" in s:  # rank 0 failed on the file itself
        assert s["error_type"] == "DataError" and str(shard) in s["error"], s
    else:  # rank 0 was ended by horovodrun, after rank 1's failure, before it met the cut
        assert s["failed_rank"] == 1, s
        assert s["error"].startswith("another worker ended first: rank 1 (exit code 2"), s
