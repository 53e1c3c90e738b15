"""`hvd-train doctor`: its report and exit code on this machine, with a planted mismatch, and
the known-bad combinations its diagnosis catches."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess

import pytest
from harness import PYTHON, ROOT, SERIES_VERSION, run, start_up_lines

from hvd_train.commands.doctor import diagnose, version_tuple
from hvd_train.runtime.keras import binding

pytestmark = pytest.mark.stack  # the doctor is the first check of a new stack


def doctor(*args: str, cwd: pathlib.Path, pythonpath: str = "") -> tuple[int, str, str]:
    env_path = os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)
    proc = run(["env", f"PYTHONPATH={env_path}", PYTHON, "-m", "hvd_train", "doctor", *args], cwd)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def here(tmp_path_factory) -> dict:
    code, out, err = doctor("--json", cwd=tmp_path_factory.mktemp("doctor"))
    assert code == 0, out + err
    return json.loads(out)


@pytest.mark.processes
def test_doctor_reports_this_machine_ready(here) -> None:
    from importlib.metadata import PackageNotFoundError, version

    import horovod

    facts = here["facts"]
    assert here["ok"] is True and [p for p in here["problems"] if p["level"] == "error"] == []
    try:
        installed = version("tensorflow-cpu")
    except PackageNotFoundError:  # the CUDA build
        installed = version("tensorflow")
    assert facts["tensorflow"]["version"] == installed
    assert facts["horovod"]["version"] == horovod.__version__ == SERIES_VERSION
    assert facts["horovod"]["patches"] == SERIES_VERSION.partition("+")[2]
    # only the frameworks Horovod was built against: no placeholder from its metadata.json
    assert facts["horovod"]["built_against"] == {"tensorflow": facts["tensorflow"]["version"]}
    assert facts["horovod"]["frameworks"] == ["tensorflow"]
    assert set(facts["horovod"]["controllers"]) == {"gloo", "mpi"}
    assert {"gloo", "mpi"} <= set(facts["horovod"]["tensor_ops"])
    assert facts["horovod"]["keeps_stop_exit_code"] is True  # built with patches/horovod-0.28.1
    assert facts["tensorflow"]["gpus"] == []  # no GPU on this machine
    assert facts["mpirun"]["version"].startswith("mpirun (Open MPI)")


@pytest.mark.processes
def test_doctor_prints_a_report_and_exits_0(tmp_path, here) -> None:
    code, out, err = doctor(cwd=tmp_path)
    assert code == 0
    assert start_up_lines(out + err) == [], err  # TensorFlow's own, as the doctor imports it
    tf_version = here["facts"]["tensorflow"]["version"]
    # TensorFlow 2.15's only Keras is the keras package, Keras 2 itself
    kerases = (
        f"{binding.describe(binding.KERAS3)}, {binding.describe(binding.KERAS2)}"
        if binding.has_keras3()
        else binding.describe(binding.KERAS2)
    )
    assert f"tensorflow   {tf_version} ({kerases}, built with CUDA: no)" in out
    assert f"built against TensorFlow {tf_version}" in out
    assert "controllers  gloo, mpi" in out
    assert out.rstrip().endswith("ready to train")


def plant_horovod_built_against(
    tmp_path: pathlib.Path, here: dict, tf_version: str
) -> pathlib.Path:
    """A folder for PYTHONPATH holding this machine's Horovod, linked file by file, but for its
    build record (metadata.json), which says it was compiled against `tf_version`."""
    real = pathlib.Path(here["facts"]["horovod"]["path"])
    planted = tmp_path / "site" / "horovod"
    planted.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "metadata.json":
            (planted / entry.name).symlink_to(entry)
    (planted / "metadata.json").write_text(json.dumps({"tensorflow": tf_version}))
    return planted.parent


@pytest.mark.processes
def test_doctor_fails_on_a_horovod_built_against_another_tensorflow(tmp_path, here) -> None:
    # A Horovod install whose build record (metadata.json, written by Horovod's setup.py and
    # checked by its own import) says it was compiled against TensorFlow 2.14.0: the real
    # package linked file by file, with that one file changed, first on PYTHONPATH.
    site = plant_horovod_built_against(tmp_path, here, "2.14.0")
    code, out, _ = doctor(cwd=tmp_path, pythonpath=str(site))
    assert code == 1, out
    tf_version = here["facts"]["tensorflow"]["version"]
    assert (
        f"error: Horovod {SERIES_VERSION} was built against TensorFlow 2.14.0, but TensorFlow {tf_version} "
        "is installed: rebuild Horovod against it"
    ) in out
    assert out.rstrip().endswith("NOT READY: 1 error(s): training cannot work here")
    code, line, err = doctor("--versions", cwd=tmp_path, pythonpath=str(site))
    assert code == 1 and "built against TensorFlow 2.14.0" in err
    assert line.strip() == f"hvd_train=0.1.0 tensorflow={tf_version} horovod={SERIES_VERSION}"


@pytest.mark.processes
def test_versions_takes_the_last_check_of_an_unchanged_install(tmp_path, here) -> None:
    """`--versions`, the question the multi-node pre-flight asks every host at every launch,
    imports neither TensorFlow nor Horovod when this interpreter's last check was of the same
    install, and answers the same; a changed install file (here Horovod's build record) is
    checked anew and its error reported; the full report never takes the memory."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    probe = ("import sys\nfrom hvd_train.cli import main\ncode = main(sys.argv[1:])\n"
             "print('tensorflow', 'tensorflow' in sys.modules, file=sys.stderr)\nsys.exit(code)")  # fmt: skip

    def doctor_in_process(*args: str, pythonpath: str = str(ROOT)):
        proc = run([PYTHON, "-c", probe, "doctor", *args], tmp_path,
                   env={**env, "PYTHONPATH": pythonpath})  # fmt: skip
        return proc.returncode, proc.stdout, proc.stderr.splitlines()[-1]

    first = doctor_in_process("--versions")
    assert first[0] == 0 and first[2] == "tensorflow True", first
    again = doctor_in_process("--versions")
    assert again == (0, first[1], "tensorflow False"), again
    assert doctor_in_process()[2] == "tensorflow True"
    tf_version = here["facts"]["tensorflow"]["version"]
    assert first[1].strip() == f"hvd_train=0.1.0 tensorflow={tf_version} horovod={SERIES_VERSION}"

    site = plant_horovod_built_against(tmp_path, here, "2.14.0")
    code, line, last = doctor_in_process("--versions", pythonpath=f"{site}{os.pathsep}{ROOT}")
    assert (code, line, last) == (1, first[1], "tensorflow True")


# --------------------------------------------------------------------------- diagnosis rules


@pytest.fixture
def facts(here) -> dict:
    """This machine's facts, to change one at a time."""
    return copy.deepcopy(here["facts"])


def errors(facts: dict) -> list[str]:
    return [p.message for p in diagnose(facts) if p.level == "error"]


def warnings_(facts: dict) -> list[str]:
    return [p.message for p in diagnose(facts) if p.level == "warning"]


@pytest.mark.processes
def test_this_machines_facts_have_no_problem(facts) -> None:
    assert errors(facts) == [] and warnings_(facts) == []


def on_tensorflow(facts: dict, version: str, keras: str | None, tf_keras: str | None) -> dict:
    facts["tensorflow"].update(version=version, keras=keras, tf_keras=tf_keras)
    facts["horovod"]["built_against"]["tensorflow"] = version
    facts["python"] = "3.11.7"  # every stack has wheels for it (this machine's may be 3.13)
    return facts


# Each stack with its Kerases: 2.15's own Keras 2, then Keras 3 and tf_keras of TF's minor.
STACK_KERASES = [
    ("2.15.1", "keras 2.15.0", None), ("2.18.1", "keras 3.15.1", "tf_keras 2.18.0"),
    ("2.19.1", "keras 3.15.1", "tf_keras 2.19.0"), ("2.20.0", "keras 3.15.1", "tf_keras 2.20.1"),
    ("2.21.0", "keras 3.15.1", "tf_keras 2.21.0"),
]  # fmt: skip


@pytest.mark.processes
def test_no_keras_3_on_a_newer_tensorflow_is_an_error(facts) -> None:
    on_tensorflow(facts, "2.18.1", "keras 2.15.0", "tf_keras 2.18.0")
    assert errors(facts) == [
        "Keras 3 does not import (TensorFlow 2.18.1: keras 2.15.0): models of runtime.keras: auto "
        "and keras cannot train; install Keras 3 (HVD_TRAIN_TF=2.18 scripts/install.sh)"
    ]


@pytest.mark.processes
@pytest.mark.parametrize(("tf_version", "keras", "tf_keras"), STACK_KERASES)
def test_supported_stacks_have_no_problem(facts, tf_version, keras, tf_keras) -> None:
    on_tensorflow(facts, tf_version, keras, tf_keras)
    assert errors(facts) == [] and warnings_(facts) == []


@pytest.mark.processes
@pytest.mark.parametrize("tf_version", ["2.16.1", "2.17.1", "2.22.0"])
def test_another_tensorflow_with_both_kerases_is_only_untested(facts, tf_version) -> None:
    minor = tf_version.rpartition(".")[0]
    on_tensorflow(facts, tf_version, "keras 3.15.1", f"tf_keras {minor}.0")
    assert errors(facts) == []
    assert warnings_(facts) == [
        f"TensorFlow {tf_version}: hvd_train is tested with 2.15.1, 2.18.1, 2.19.1, 2.20.0 or 2.21.0"
    ]


@pytest.mark.processes
def test_tf_keras_of_another_minor_version_is_a_warning(facts) -> None:
    on_tensorflow(facts, "2.18.1", "keras 3.15.1", "tf_keras 2.17.0")
    assert errors(facts) == []
    assert warnings_(facts) == ["tf_keras 2.17.0 with TensorFlow 2.18.1: tf_keras should match TensorFlow's minor version"]  # fmt: skip


@pytest.mark.processes
def test_no_tf_keras_is_a_warning_for_model_keras_tf_keras(facts) -> None:
    # Keras 3 trains the default; tf_keras only what asks for it.
    on_tensorflow(facts, "2.21.0", "keras 3.15.1", None)
    assert errors(facts) == []
    assert warnings_(facts) == [
        "no tf_keras (TensorFlow 2.21.0): runtime.keras: tf_keras (Keras 2) cannot train here; "
        "install tf_keras 2.21 (HVD_TRAIN_TF=2.21 scripts/install.sh)"
    ]
    on_tensorflow(facts, "2.17.1", "keras 3.15.1", None)  # no stack of its own: the newest named
    assert warnings_(facts)[0] == (
        "no tf_keras (TensorFlow 2.17.1): runtime.keras: tf_keras (Keras 2) cannot train here; "
        "install tf_keras 2.17 (or HVD_TRAIN_TF=2.21 scripts/install.sh: TensorFlow 2.21.0 with "
        "Keras 3 and tf_keras)"
    )


@pytest.mark.processes
@pytest.mark.parametrize(
    ("python", "tf_version", "supported"),
    [("3.11.7", "2.15.1", True), ("3.12.1", "2.15.1", False), ("3.12.1", "2.19.1", True),
     ("3.13.0", "2.19.1", False), ("3.13.0", "2.20.0", True), ("3.13.0", "2.21.0", True),
     ("3.14.0", "2.21.0", False), ("3.9.18", "2.21.0", False), ("3.13.0", "2.17.1", True)],
)  # fmt: skip
def test_python_versions_follow_the_stacks_wheels(facts, python, tf_version, supported) -> None:
    # A TensorFlow without a stack of its own (2.17) with the Kerases a 2.16+ install brings.
    kerases = {v: (k, t) for v, k, t in STACK_KERASES}
    on_tensorflow(facts, tf_version, *kerases.get(tf_version, ("keras 3.15.1", "tf_keras 2.17.0")))
    facts["python"] = python
    said = [w for w in warnings_(facts) if w.startswith("Python ")]
    assert said == ([] if supported else [
        f"Python {python}: hvd_train supports 3.10-3.11 with TensorFlow 2.15, 3.10-3.12 with "
        "2.18-2.19, 3.10-3.13 with 2.20-2.21"
    ])  # fmt: skip


def test_the_doctor_knows_the_pythons_the_install_takes() -> None:
    """The doctor's Pythons per stack are the ones scripts/stack.sh installs on."""
    from hvd_train.commands.doctor import NEWEST_PYTHON, STACKS

    stack_sh = ROOT / "scripts" / "stack.sh"
    script = f'for s in {" ".join(STACKS)}; do HVD_TRAIN_TF=$s; . "{stack_sh}"; stack_select; echo "$s $STACK_PYTHONS"; done'  # fmt: skip
    lines = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True
    ).stdout
    install = {s: pythons for s, _, pythons in (line.partition(" ") for line in lines.splitlines())}
    doctor = {s: " ".join(f"3.{m}" for m in range(10, n + 1)) for s, n in NEWEST_PYTHON.items()}
    assert install == doctor


@pytest.mark.processes
def test_extension_that_does_not_load_is_an_error(facts) -> None:
    facts["horovod"]["tensorflow_extension_error"] = (
        "NotFoundError: mpi_lib.so: undefined symbol: _ZN10tensorflow8OpKernel"
    )
    assert errors(facts) == [
        "horovod.tensorflow does not load: NotFoundError: mpi_lib.so: undefined symbol: "
        "_ZN10tensorflow8OpKernel; rebuild Horovod against the installed TensorFlow "
        "(scripts/install.sh)"
    ]


@pytest.mark.processes
@pytest.mark.parametrize(
    ("controllers", "mpirun", "level", "start"),
    [
        (["mpi"], None, "error", "no usable controller: Horovod was built without Gloo, and MPI is built but mpirun"),
        ([], {"path": "/usr/bin/mpirun", "version": "x"}, "error", "no usable controller"),
        (["gloo", "mpi"], None, "warning", "mpirun is not on PATH: only the Gloo controller works"),
        (["gloo"], None, "warning", "Horovod was built without MPI"),
    ],
)  # fmt: skip
def test_controller_problems(facts, controllers, mpirun, level, start) -> None:
    facts["horovod"]["controllers"], facts["mpirun"] = controllers, mpirun
    found = [p for p in diagnose(facts) if p.message.startswith(start)]
    assert len(found) == 1 and found[0].level == level, diagnose(facts)


@pytest.mark.processes
def test_gpus_tensorflow_cannot_see_are_a_warning(facts) -> None:
    facts["nvidia_smi_gpus"] = 4
    assert errors(facts) == []
    assert warnings_(facts)[0].startswith(
        "nvidia-smi lists 4 GPU(s) but TensorFlow sees none (the CPU-only TensorFlow wheel is installed)"
    )


@pytest.mark.processes
def test_gpus_without_nccl_are_a_warning(facts) -> None:
    facts["tensorflow"]["gpus"] = ["/physical_device:GPU:0"]
    assert warnings_(facts)[0].startswith("TensorFlow sees GPUs but Horovod was built without NCCL")
    facts["horovod"]["tensor_ops"].append("nccl")
    assert warnings_(facts) == []


@pytest.mark.processes
def test_horovodrun_that_loses_a_stopped_workers_exit_code_is_a_warning(facts) -> None:
    facts["horovod"]["keeps_stop_exit_code"] = False
    assert errors(facts) == []
    assert warnings_(facts) == [
        "horovodrun may exit 0 after Ctrl-C or SIGTERM (Horovod 0.28.1 can lose a stopped "
        "worker's exit code; summary.json still says interrupted): scripts/install.sh builds "
        "Horovod with hvd_train's patches (patches/horovod-0.28.1), which fix it"
    ]


@pytest.mark.processes
def test_missing_tensorflow_or_horovod_is_an_error(facts) -> None:
    broken = copy.deepcopy(facts)
    broken["tensorflow"] = {"version": None, "error": "ModuleNotFoundError: No module named 'tensorflow'"}  # fmt: skip
    assert errors(broken)[0].startswith("TensorFlow does not import: ModuleNotFoundError")
    facts["horovod"] = {"version": None, "error": "ModuleNotFoundError: No module named 'horovod'"}
    assert errors(facts) == ["Horovod does not import: ModuleNotFoundError: No module named 'horovod'; run scripts/install.sh"]  # fmt: skip


def test_version_tuple() -> None:
    assert version_tuple("2.16.0rc1") == (2, 16, 0)
    assert version_tuple("2.15.1") > version_tuple("2.15")
    assert version_tuple(None) == ()
