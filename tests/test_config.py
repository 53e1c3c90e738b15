"""The config loader: every shipped config loads; every invalid one fails with its exact message."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import resource
import subprocess
import sys

import pytest
import yaml

from hvd_train.base.errors import ConfigError, DataError
from hvd_train.config import Config, check, derive, dump_yaml, load_config
from hvd_train.config.typed_yaml import MAX_CONFIG_BYTES, MAX_OVERRIDE_BYTES

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "invalid_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: pathlib.Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    check(cfg, world_size=2)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_opens_with_its_launch_command(path: pathlib.Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and "hvd_train" in first and str(path.name) in first, first


def test_shipped_configs_exist() -> None:
    assert any(p.name == "quickstart.yaml" for p in SHIPPED)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_config_gives_its_exact_message(path: pathlib.Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must open with '# expect: MESSAGE'"
    expected = first.removeprefix("# expect: ").replace("{file}", str(path))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == expected


def test_defaults_give_a_value_for_every_field() -> None:
    cfg = load_config(None)
    assert cfg.callbacks == ()  # the one top-level key that is a list, not a section
    for section in dataclasses.fields(cfg):
        if section.name == "callbacks":
            continue
        for f in dataclasses.fields(getattr(cfg, section.name)):
            assert f.default is not dataclasses.MISSING, f"{section.name}.{f.name} has no default"


def test_config_is_frozen() -> None:
    cfg = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 3  # type: ignore[misc]


def test_set_overrides_file_and_is_typed_by_field(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: 3\n  batch_size: 16\n")
    cfg = load_config(
        path,
        ["train.epochs=5", "optimizer.learning_rate=1e-3", "model.dense_units=[64, 32]",
         "train.steps_per_epoch=null", "train.steps_per_epoch=7"],
    )  # fmt: skip
    assert cfg.train.epochs == 5
    assert cfg.train.batch_size == 16  # from the file
    assert cfg.optimizer.learning_rate == pytest.approx(1e-3)  # YAML reads 1e-3 as a string
    assert cfg.model.dense_units == (64, 32)
    assert cfg.train.steps_per_epoch == 7  # later overrides win


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.epocs=3", "--set train.epocs=3: train.epocs: unknown key; did you mean train.epochs?"),
        ("train.epochs=x", "--set train.epochs=x: train.epochs: expected an integer, got 'x' (str)"),
        ("train=3", "--set train=3: train: expected a mapping of keys, got 3 (int)"),
        ("epochs", "--set epochs: expected key=value, for example train.epochs=5"),
        ("train.steps_per_epoch=x", "--set train.steps_per_epoch=x: train.steps_per_epoch: expected an integer or null, got 'x' (str)"),
        ("train.steps_per_epoch=0", "--set train.steps_per_epoch=0: train.steps_per_epoch: expected a value >= 1, got 0 (int)"),
        ("horovod.cycle_time_ms=-1", "--set horovod.cycle_time_ms=-1: horovod.cycle_time_ms: expected a value > 0.0, got -1 (int)"),
        ("train.verbose=3", "--set train.verbose=3: train.verbose: expected one of 0, 1, 2 (or true/false for 1/0), got 3 (int)"),
        ("train.verbose=1.0", "--set train.verbose=1.0: train.verbose: expected one of 0, 1, 2 (or true/false for 1/0), got 1.0 (float)"),
        ("train.log_every_s=-1", "--set train.log_every_s=-1: train.log_every_s: expected a value >= 0.0, got -1 (int)"),
    ],
)  # fmt: skip
def test_bad_override_names_the_override(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


@pytest.mark.parametrize(("given", "level"), [("false", 0), ("true", 1), ("0", 0), ("2", 2)])
def test_verbose_is_a_level_and_old_booleans_still_load(given: str, level: int) -> None:
    verbose = load_config(None, [f"train.verbose={given}"]).train.verbose
    assert verbose == level and type(verbose) is int  # dumped as 0/1, not false/true


def test_convnet7_still_loads_as_convnet(tmp_path: pathlib.Path) -> None:
    """convnet7, convnet's old name, keeps old configs working; the resolved config says
    convnet."""
    (tmp_path / "old.yaml").write_text("model:\n  name: convnet7\n")
    assert load_config(tmp_path / "old.yaml").model.name == "convnet"
    assert load_config(None, ["model.name=convnet7"]).model.name == "convnet"


def test_override_key_nested_past_the_depth_bound_is_refused() -> None:
    item = ".".join(["train"] * 65) + "=1"  # a deeper key would only be a mapping nobody reads
    with pytest.raises(ConfigError) as info:
        load_config(None, [item])
    assert str(info.value) == (
        f"--set {item[:80]}... ({len(item)} characters): the key has more than 64 dotted parts"
    )


def test_resolved_config_round_trips_through_yaml(tmp_path: pathlib.Path) -> None:
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", ["train.epochs=2"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(path) == cfg


def test_global_batch_must_divide_by_workers() -> None:
    cfg = load_config(None, ["train.batch_size=30", "train.batch_size_mode=global"])
    check(cfg, world_size=3)
    with pytest.raises(ConfigError, match="a global batch of 30 does not divide evenly by 4"):
        check(cfg, world_size=4)


@pytest.mark.parametrize(
    ("mode", "scaling", "world", "per_worker", "global_batch", "lr"),
    [
        ("per_worker", "linear", 4, 32, 128, 0.4),
        ("per_worker", "sqrt", 4, 32, 128, 0.2),
        ("per_worker", "none", 4, 32, 128, 0.1),
        ("global", "linear", 4, 8, 32, 0.1),  # the global batch does not grow: nor does the rate
        ("per_worker", "linear", 1, 32, 32, 0.1),
    ],
)
def test_derived_batches_and_learning_rate(mode, scaling, world, per_worker, global_batch, lr):
    cfg = load_config(None, [f"train.batch_size_mode={mode}", "train.batch_size=32",
                             "optimizer.learning_rate=0.1", f"optimizer.lr_scaling={scaling}"])  # fmt: skip
    plan = derive(cfg, world, num_train=1000)
    assert (plan.per_worker_batch, plan.global_batch) == (per_worker, global_batch)
    assert plan.scaled_lr == pytest.approx(lr)
    assert plan.steps_per_epoch == 1000 // global_batch


def test_steps_per_epoch_follow_remainder_and_cap() -> None:
    base = ["train.batch_size=10", "optimizer.warmup_epochs=1.5"]
    drop = derive(load_config(None, base), 2, num_train=105)
    assert (drop.steps_per_epoch, drop.examples_per_epoch, drop.warmup_steps) == (5, 100, 8)
    pad = derive(load_config(None, [*base, "data.remainder=pad_by_repeat"]), 2, num_train=105)
    assert (pad.steps_per_epoch, pad.examples_per_epoch) == (6, 120)
    capped = derive(load_config(None, [*base, "train.steps_per_epoch=3"]), 2, num_train=105)
    assert capped.steps_per_epoch == 3


def test_steps_per_execution_must_divide_the_epochs_steps_at_the_worker_count() -> None:
    """Keras 3 runs an epoch's last call to its full length, into the next epoch's batches: a
    steps_per_execution that does not divide the epoch is refused in one line that names the
    divisors near it and a cap that fits (whole accumulation windows too)."""
    base = ["train.batch_size=10", "train.steps_per_execution=4"]
    assert derive(load_config(None, base), 1, num_train=200).steps_per_epoch == 20
    with pytest.raises(ConfigError) as e:  # 2 workers: 10 steps an epoch
        derive(load_config(None, base), 2, num_train=200)
    assert str(e.value) == (
        "train.steps_per_execution: 4 does not divide an epoch's 10 steps at 2 worker(s) (the "
        "epoch's last call would run into the next epoch's batches); use a divisor of 10 (1, 2, "
        "5, 10), or set train.steps_per_epoch to 8"
    )
    with pytest.raises(ConfigError, match=r"set train.steps_per_epoch to 24$"):
        derive(load_config(None, [*base, "train.gradient_accumulation_steps=3"]), 1, 280)


def test_fewer_examples_than_one_global_batch_is_a_data_error() -> None:
    cfg = load_config(None, ["train.batch_size=64"])
    with pytest.raises(DataError, match="50 training examples are fewer than one global batch"):
        derive(cfg, 2, num_train=50)


def test_config_module_prints_values_for_launch_scripts(capsys) -> None:
    from hvd_train.commands.config import main

    path = str(ROOT / "configs" / "quickstart.yaml")
    assert main(["--config", path, "--get", "train.batch_size", "--get", "data.source"]) == 0
    assert capsys.readouterr().out.split() == ["32", "digits"]
    assert main(["--config", path, "--get", "train.nope"]) == 2
    full = yaml.safe_load((main(["--config", path]), capsys.readouterr().out)[1])
    assert full["train"]["epochs"] == load_config(path).train.epochs


# --------------------------------------------------------------------------- bounds

TOO_MANY = (
    "more than 10000 values once its YAML aliases are expanded (a config has a few hundred): "
    'nested aliases multiply (a "billion laughs"); write the values out instead'
)


def hvd_train_cli(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """`python -m hvd_train ARGS` in a fresh process held to 1 GiB of address space: a loader
    that expanded a bomb fails there with MemoryError instead of eating the machine."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    return subprocess.run(
        [sys.executable, "-m", "hvd_train", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=cap, timeout=300,
    )  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The CLI's one line on stderr, after checking it exited 2 and printed nothing else."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def billion_laughs(flow: bool = False) -> str:
    """Nine lists, each of nine aliases of the one before: 9^9 (387 million) values once
    expanded, in 300 bytes."""
    items = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    items += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return f"[{', '.join(items)}]" if flow else "".join(f"\n    - {i}" for i in items)


def mapping_laughs() -> str:
    """The same with mappings, under an unknown key (read before any key is checked)."""
    lines = ["x:", "  l0: &l0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    for i in range(1, 9):
        lines.append(f"  l{i}: &l{i} {{" + ", ".join(f"k{j}: *l{i - 1}" for j in range(9)) + "}")
    return "\n".join(lines) + "\n"


@pytest.mark.processes
@pytest.mark.parametrize(
    ("command", "text", "line"),
    [
        ("config", "model:\n  dense_units:" + billion_laughs() + "\n", 7),
        ("train", "model:\n  dense_units:" + billion_laughs() + "\n", 7),
        ("config", mapping_laughs(), 5),
    ],
    ids=["config-sequences", "train-sequences", "config-mappings"],
)
def test_alias_bomb_fails_in_one_line_within_1_gib(tmp_path, command, text, line) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(text)
    args = ["config", "--config", str(bomb)] if command == "config" else ["--config", str(bomb)]
    error = one_error_line(hvd_train_cli(args, tmp_path))
    assert error == f"hvd_train: error: {bomb} (line {line}): {TOO_MANY}"


@pytest.mark.processes
def test_alias_bomb_in_a_set_value_fails_in_one_line_within_1_gib(tmp_path) -> None:
    item = f"model.dense_units={billion_laughs(flow=True)}"
    proc = hvd_train_cli(["config", "--config", str(QUICKSTART), "--set", item], tmp_path)
    label = f"--set {item[:80]}... ({len(item)} characters)"
    assert one_error_line(proc) == f"hvd_train: error: {label}: {TOO_MANY}"


@pytest.mark.processes
def test_config_file_over_1_mib_is_refused_before_parsing(tmp_path) -> None:
    fits = tmp_path / "fits.yaml"  # exactly the limit: comments, then one key
    key = "train:\n  epochs: 3\n"
    line = "#" * 1023 + "\n"
    padding = line * ((MAX_CONFIG_BYTES - len(key)) // len(line))
    fits.write_text(padding + key + "#" * (MAX_CONFIG_BYTES - len(padding) - len(key)))
    assert fits.stat().st_size == MAX_CONFIG_BYTES
    proc = hvd_train_cli(["config", "--config", str(fits), "--get", "train.epochs"], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "3\n"), proc.stderr
    over = tmp_path / "over.yaml"
    over.write_text(fits.read_text() + "\n")
    sparse = tmp_path / "sparse.yaml"  # 50 MB of NUL bytes: not YAML, so parsing would say so
    with open(sparse, "wb") as f:
        f.truncate(50 * 2**20)
    for path in (over, sparse):
        error = one_error_line(hvd_train_cli(["config", "--config", str(path)], tmp_path))
        assert error == (
            f"hvd_train: error: {path}: {path.stat().st_size} bytes, over the 1 MiB a config "
            "file may hold (a config is a few KB); is this the right file?"
        )


@pytest.mark.processes
def test_set_value_over_64_kib_is_refused(tmp_path) -> None:
    item = "run.dir=" + "x" * MAX_OVERRIDE_BYTES
    proc = hvd_train_cli(["config", "--config", str(QUICKSTART), "--set", item], tmp_path)
    assert one_error_line(proc) == (
        f"hvd_train: error: --set {item[:80]}... ({len(item)} characters): {len(item)} bytes, "
        "over the 64 KiB a --set may hold (a value is a number, a name, a path or a short list)"
    )


@pytest.mark.processes
@pytest.mark.parametrize(
    ("length", "error", "limit"),
    [
        # The string itself is too long: the message quotes its start and end.
        (500_000, "data.train_dir: expected a string of at most 4096 characters", 300),
        # Each string is fine, but a message holding the list's repr would be 20 MB.
        (4000, "model.dense_units: expected a list of integers, got ['xxx", 600),
    ],
    ids=["long-string", "list-of-aliases"],
)
def test_error_messages_never_echo_a_huge_value(tmp_path, length, error, limit) -> None:
    # One string and 5,000 aliases of it: a small document.
    config = tmp_path / "c.yaml"
    aliases = ", ".join(["*s"] * 5000)
    config.write_text(
        f"data:\n  train_dir: &s {'x' * length}\nmodel:\n  dense_units: [{aliases}]\n"
    )
    line = one_error_line(hvd_train_cli(["config", "--config", str(config)], tmp_path))
    assert line.startswith(f"hvd_train: error: {config}: {error}"), line[:300]
    assert len(line) < limit, line
