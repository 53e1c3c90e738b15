"""InputWait in one process, on clocks the test controls: what it measures and when it warns.

No assertion here depends on how fast the machine is. The arithmetic and the warning rules run
on a fake clock; the stamping (the pipeline's last stage reads the clock inside the step, after
the step began and before it ended) runs in a real `model.fit` on a logical clock that counts
reads instead of seconds. The end-to-end run (tests/test_data.py) checks only that the
fraction reaches the files and lies in [0, 1].
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from hvd_train.data.diagnostics import advice_for
from hvd_train.runtime import distributed
from hvd_train.train.callbacks import input_wait
from hvd_train.train.callbacks.input_wait import InputWait


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged(monkeypatch) -> list[str]:
    """One worker, no Horovod job: rank 0's log lines, collected."""
    lines: list[str] = []
    monkeypatch.setattr(distributed, "allgather_object", lambda obj, name: [obj])
    monkeypatch.setattr(input_wait.distributed, "log", lines.append)
    return lines


class FakeStamp:
    """The pipeline's clock: the fake clock's time, `offset` seconds from it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.offset = clock, 0.0

    def __call__(self) -> tf.Tensor:
        return tf.constant(self.clock.now + self.offset, tf.float64)


def run_epoch(iw: InputWait, clock: FakeClock, epoch: int, steps: list[tuple[float, float]]):
    """Steps of (seconds from the step's begin until its batch arrived, step seconds)."""
    logs: dict = {}
    iw.on_epoch_begin(epoch)
    for wait, seconds in steps:
        iw.on_train_batch_begin(0)
        iw._stamp.offset = wait
        iw.arrived()  # the pipeline's stage, as the step fetches its batch
        clock.now += seconds
        iw.on_train_batch_end(0)
    iw.on_epoch_end(epoch, logs)
    return logs["input_wait_fraction"]


def make(
    warn_above: float, epochs: int, advice: str | None = "ADVICE"
) -> tuple[InputWait, FakeClock]:
    clock = FakeClock()
    iw = InputWait(warn_above, advice, clock=clock, stamp=FakeStamp(clock))
    iw.set_params({"epochs": epochs})
    return iw, clock


def test_fraction_is_the_epochs_waiting_time_over_its_step_time(logged) -> None:
    iw, clock = make(0.5, epochs=2)
    # The run's first step (tracing) is left out; a batch already there waited nothing; one
    # that came as its step ended waited the whole step.
    fraction = run_epoch(iw, clock, 0, [(9.0, 10.0), (0.25, 1.0), (0.0, 1.0), (2.0, 2.0)])
    assert fraction == pytest.approx((0.25 + 0 + 2.0) / (1.0 + 1.0 + 2.0))
    # Each epoch on its own: the first step of later epochs counts.
    assert run_epoch(iw, clock, 1, [(0.5, 2.0), (0.0, 2.0)]) == pytest.approx(0.5 / 4.0)


def test_worst_worker_counts(logged, monkeypatch) -> None:
    monkeypatch.setattr(distributed, "allgather_object", lambda obj, name: [obj, 0.75])
    iw, clock = make(0.5, epochs=1)
    assert run_epoch(iw, clock, 0, [(0.0, 1.0), (0.0, 1.0)]) == 0.75
    assert len(logged) == 1 and "input_wait_fraction 0.750 > 0.5" in logged[0]


def test_warns_once_after_the_warm_up_epoch_with_the_advice(logged) -> None:
    iw, clock = make(0.3, epochs=3)
    slow = [(0.5, 1.0)] * 3  # half of every step waiting
    run_epoch(iw, clock, 0, slow)
    assert logged == []  # the first epoch of several is warm-up
    run_epoch(iw, clock, 1, slow)
    assert logged == [
        "warning: epoch 2 spent 50% of its step time waiting for input "
        "(input_wait_fraction 0.500 > 0.3); ADVICE"
    ]
    run_epoch(iw, clock, 2, slow)
    assert len(logged) == 1  # once per run


def test_a_single_epoch_run_warns_in_it_and_none_at_or_below_the_threshold(logged) -> None:
    iw, clock = make(0.3, epochs=1)
    run_epoch(iw, clock, 0, [(0.0, 1.0), (0.5, 1.0)])
    assert len(logged) == 1 and logged[0].startswith("warning: epoch 1 spent 50%")
    logged.clear()
    iw, clock = make(0.5, epochs=1)
    run_epoch(iw, clock, 0, [(0.0, 1.0), (0.5, 1.0)])  # exactly at the threshold
    assert logged == []


def test_stamp_is_read_inside_each_step_after_it_began(logged) -> None:
    """A real `fit` on a logical clock: every read, Python's or the pipeline's, adds 1. Read
    inside the step, each step reads begin, then stamp: 1 of its 2 ticks waiting (the epoch's
    end reads once more). If the stamp stage ran ahead of the step (a prefetch slipped in
    after it), stamps would be read before their steps began and count no wait."""
    ticks = tf.Variable(0.0, dtype=tf.float64)
    iw = InputWait(
        0.9, clock=lambda: float(ticks.assign_add(1.0)), stamp=lambda: ticks.assign_add(1.0)
    )
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((tf.zeros([4, 2]), tf.zeros([4, 1]))).repeat(10)
    data = data.prefetch(4)  # batches already waiting: the stamp must still be read in-step
    history = model.fit(
        iw.attach(data), epochs=2, steps_per_epoch=5, callbacks=[iw], verbose=0, shuffle=False
    )
    assert history.history["input_wait_fraction"] == [0.5, 0.5]


def test_with_several_steps_a_call_only_each_calls_first_fetch_is_timed(logged) -> None:
    """The same logical clock, 2 steps a call (train.steps_per_execution): a call reads begin,
    its first stamp, then its second stamp (2 fetches, 1 begin). Only the first fetch has a
    begin to be timed from: 1 of each call's 3 ticks waits. Were the second fetch counted from
    the same begin, the fraction would be (1 + 2) / 3 = 1."""
    ticks = tf.Variable(0.0, dtype=tf.float64)
    iw = InputWait(
        0.9,
        clock=lambda: float(ticks.assign_add(1.0)),
        stamp=lambda: ticks.assign_add(1.0),
        steps_per_execution=2,
    )
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    data = tf.data.Dataset.from_tensors((tf.zeros([4, 2]), tf.zeros([4, 1]))).repeat(8)
    history = model.fit(
        iw.attach(data), epochs=2, steps_per_epoch=4, callbacks=[iw], verbose=0, shuffle=False
    )
    assert history.history["input_wait_fraction"] == pytest.approx([1 / 3, 1 / 3])


def test_advice_fits_the_source() -> None:
    for source in ("image_folder", "tfrecord"):
        assert "data.cache: memory" in advice_for(source)
    for source in ("synthetic", "digits"):  # already in memory: nothing the user can change
        assert advice_for(source) is None


def test_no_warning_without_advice_but_the_fraction_is_recorded(logged) -> None:
    """Data already in memory: a wait is the step's own start-up, which no setting removes."""
    iw, clock = make(0.1, epochs=1, advice=advice_for("digits"))
    assert run_epoch(iw, clock, 0, [(0.0, 1.0), (1.0, 1.0), (1.0, 1.0)]) == 1.0
    assert logged == []


def _stages(ds: tf.data.Dataset) -> list[str]:
    """The dataset's transformations, last first, by class (`_PrefetchDataset`, ...)."""
    names = []
    while ds is not None:
        names.append(type(ds).__name__)
        ds = getattr(ds, "_input_dataset", None)
    return names


@pytest.mark.parametrize("gpu", [False, True])
def test_prefetch_to_device_is_the_last_stage_fit_gets(monkeypatch, gpu: bool) -> None:
    """With data.prefetch_to_device and a GPU visible (faked: the copy to /gpu:0 is only built,
    not run), the dataset `fit` gets ends with the device copy and its prefetch, after the
    resumed epoch's skip and the input-wait stamp, as TensorFlow requires; without a GPU it
    ends with the stamp."""
    from hvd_train.config import load_config
    from hvd_train.data.job import Position, plan_job
    from hvd_train.data.sources import load_source
    from hvd_train.train.run.fitting import fit_dataset

    cfg = load_config(None, ["data.source=digits", "data.prefetch_to_device=true"])
    job = plan_job(cfg, load_source(cfg), 1)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    if gpu:  # faked: the copy to /gpu:0 is built, never run
        visible, fake = tf.config.get_visible_devices, [tf.config.PhysicalDevice("GPU:0", "GPU")]
        monkeypatch.setattr(
            tf.config, "get_visible_devices", lambda kind=None: fake if kind == "GPU" else visible(kind)
        )  # fmt: skip
    stages = _stages(fit_dataset(job, Position(0, 3), InputWait(0.5)))
    # the input-wait stamp (a map, with its options) right after the resumed epoch's skip and
    # take (its steps left), after train_dataset's prefetch
    fed = ["_OptionsDataset", "_MapDataset", "_TakeDataset", "_SkipDataset", "_PrefetchDataset"]
    expected = ["_PrefetchDataset", "_CopyToDeviceDataset", *fed] if gpu else fed
    assert stages[: len(expected)] == expected, stages
    assert stages.count("_CopyToDeviceDataset") == int(gpu), stages
