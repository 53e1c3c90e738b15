"""`hvd-train doctor [--json | --versions]`: can this machine train, and if not, why not.

Gathers facts (Python, TensorFlow, Keras, Horovod and what it was built with, the GPUs
TensorFlow sees, MPI), then `diagnose` turns them into problems. An `error` means training
cannot work here (exit code 1); a `warning` means it works, but not as well as it could.

Nothing here creates a TensorFlow context or starts Horovod: GPUs are listed with
`tf.config.list_physical_devices`, Horovod's build with its `*_built()` functions, which read
the compiled library without `hvd.init()`.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import hvd_train
from hvd_train.base import logs
from hvd_train.base.files import atomic_write, cache_file
from hvd_train.launcher.horovodrun import count_gpus
from hvd_train.record import layout
from hvd_train.runtime.keras.binding import version_tuple

# The stacks scripts/install.sh installs (scripts/stack.sh, HVD_TRAIN_TF).
SUPPORTED_TENSORFLOW = ("2.15.1", "2.18.1", "2.19.1", "2.20.0", "2.21.0")
SUPPORTED_TEXT = "2.15.1, 2.18.1, 2.19.1, 2.20.0 or 2.21.0"
STACKS = tuple(v.rpartition(".")[0] for v in SUPPORTED_TENSORFLOW)  # the HVD_TRAIN_TF values
# The Pythons each stack's TensorFlow has wheels for, 3.10 to this minor (scripts/stack.sh's
# STACK_PYTHONS; tests/test_doctor.py keeps the two the same).
NEWEST_PYTHON = {"2.15": 11, "2.18": 12, "2.19": 12, "2.20": 13, "2.21": 13}
PYTHONS_TEXT = "3.10-3.11 with TensorFlow 2.15, 3.10-3.12 with 2.18-2.19, 3.10-3.13 with 2.20-2.21"
TESTED_HOROVOD = "0.28.1"
# Horovod's compiled extensions, one per framework (horovod/<framework>/<name>*.so).
_FRAMEWORK_LIBS = {"tensorflow": "mpi_lib", "torch": "mpi_lib_v2", "mxnet": "mpi_lib"}
_TENSOR_OPS = ("nccl", "mpi", "gloo", "ddl", "ccl")


@dataclass(frozen=True)
class Problem:
    level: str  # "error": training cannot work here; "warning": it works, but worse
    message: str


# --------------------------------------------------------------------------- facts


def gather(remembered: bool = False) -> dict[str, Any]:
    """Everything the diagnosis needs, as plain data (what `--json` prints under `facts`).

    `remembered`: TensorFlow's and Horovod's facts (the import of both, seconds of CPU) are
    taken from the last check of this interpreter when its install has not changed since
    (`install_key`); the pre-flight of a multi-node launch asks every host at every launch. Each
    check that finds both importing is kept for the next.
    """
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "hvd_train": hvd_train.__version__,
        "env": {k: os.environ.get(k) for k in ("TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES")},
    }
    gpus = _nvidia_smi_gpus()
    key = install_key(facts["env"], gpus)
    kept = _kept(key) if remembered else None
    if kept is None:
        kept = {"tensorflow": _tensorflow_facts(), "horovod": _horovod_facts()}
        _keep(key, kept)
    facts["tensorflow"], facts["horovod"] = kept["tensorflow"], kept["horovod"]
    facts["nvidia_smi_gpus"] = gpus
    facts["mpirun"] = _mpirun()
    return facts


def install_key(env: dict[str, str | None], gpus: int | None) -> dict[str, Any]:
    """What TensorFlow's and Horovod's facts depend on, read without importing either: this
    interpreter; the path, size and time of the files an install changes (each package's
    `__init__.py`, Horovod's with its version and patch series; TensorFlow's libraries; Horovod's
    build record and TensorFlow extension); the settings that change what TensorFlow reports; the GPUs nvidia-smi
    lists. A library that goes missing outside these packages (a host's libmpi, say) is not
    seen until the job starts, which then names the worker that failed."""
    files: dict[str, Any] = {}
    for package, patterns in (
        ("tensorflow", ("libtensorflow*.so*",)),
        ("keras", ()),
        ("tf_keras", ()),
        ("horovod", ("metadata.json", "tensorflow/mpi_lib*.so")),
    ):  # fmt: skip
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):  # ValueError: a package blocked in sys.modules
            spec = None
        if spec is None or spec.origin is None:
            files[package] = None
            continue
        folder = os.path.dirname(spec.origin)
        paths = [spec.origin, *(p for pattern in patterns for p in glob.glob(os.path.join(folder, pattern)))]  # fmt: skip
        files[package] = {path: _stat(path) for path in sorted(paths)}
    return {"python": sys.executable, "version": sys.version, "env": env, "gpus": gpus, "files": files}  # fmt: skip


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _kept_path() -> str:
    """Where this interpreter's last check is kept: `$XDG_CACHE_HOME/hvd_train/doctor`
    (default `~/.cache/hvd_train/doctor`), one file per interpreter."""
    return cache_file("doctor", sys.executable)


def _kept(key: dict[str, Any]) -> dict[str, Any] | None:
    """The TensorFlow and Horovod facts of the last check, if it was of this install."""
    kept = _read_json(_kept_path())
    if not kept or kept.get("key") != key:
        return None
    return {"tensorflow": kept["tensorflow"], "horovod": kept["horovod"]}


def _keep(key: dict[str, Any], facts: dict[str, Any]) -> None:
    """Keeps a check in which TensorFlow and Horovod's TensorFlow extension both imported (one
    that failed is made again next time: a failure is worth a second look). Best effort: a
    folder that cannot be written only means no memory."""
    tf, hv = facts["tensorflow"], facts["horovod"]
    if not (tf.get("version") and hv.get("version")) or hv.get("tensorflow_extension_error"):
        return
    path = _kept_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as f:
            json.dump({"key": key, **facts}, f)
    except OSError:
        pass


def _tensorflow_facts() -> dict[str, Any]:
    try:
        logs.quiet_tensorflow()  # its start-up lines are not facts (a failed import's output is)
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - any failure to import is the finding
        return {"version": None, "error": _one_line(e)}
    out: dict[str, Any] = {
        "version": tf.__version__,
        "built_with_cuda": tf.test.is_built_with_cuda(),
        # Enumerates GPUs without creating a context on them (device_lib would).
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }
    # The two Kerases hvd_train can train with (runtime.keras): `keras` (Keras 3 on 2.16+, Keras 2
    # itself on 2.15) and, on 2.16+, Keras 2 as the tf_keras package.
    for package in ("keras", "tf_keras"):
        try:
            module = importlib.import_module(package)
            out[package] = f"{package} {module.__version__}"
        except Exception as e:  # noqa: BLE001 - any failure to import is the finding
            out[package], out[f"{package}_error"] = None, _one_line(e)
    return out


def _horovod_facts() -> dict[str, Any]:
    try:
        import horovod
    except Exception as e:  # noqa: BLE001
        return {"version": None, "error": _one_line(e)}
    pkg = os.path.dirname(os.path.abspath(horovod.__file__))
    out: dict[str, Any] = {
        "version": horovod.__version__,
        # hvd_train's patch series it was built with (scripts/horovod_series.sh labels the
        # version 0.28.1+hvdtrain.g<hash>); None: a Horovod built some other way.
        "patches": horovod.__version__.partition("+")[2] or None,
        "path": pkg,
        # Horovod's setup.py records the framework versions it compiled against here; its own
        # import of horovod.tensorflow compares this record with the installed TensorFlow.
        "built_against": _framework_versions(_read_json(os.path.join(pkg, "metadata.json"))),
        "frameworks": [
            fw
            for fw, lib in _FRAMEWORK_LIBS.items()
            if glob.glob(os.path.join(pkg, fw, f"{lib}.*so"))
        ],
    }
    out.update(_horovod_tensorflow_build())
    out["keeps_stop_exit_code"] = _keeps_stop_exit_code()
    return out


def _keeps_stop_exit_code() -> bool | None:
    """Whether horovodrun keeps a stopped worker's exit code: Horovod 0.28.1 built with
    patches/horovod-0.28.1/0001 (None: its launcher does not import)."""
    try:
        from horovod.runner.common.util import safe_shell_exec
    except Exception:  # noqa: BLE001
        return None
    return hasattr(safe_shell_exec, "_exited_unreaped")


def _horovod_tensorflow_build() -> dict[str, Any]:
    """Loads horovod.tensorflow's compiled library and asks what it was built with."""
    try:
        with warnings.catch_warnings():  # its version-mismatch warning: diagnose() reports it
            warnings.simplefilter("ignore")
            import horovod.tensorflow as hvd
    except Exception as e:  # noqa: BLE001 - e.g. "undefined symbol" after a TensorFlow upgrade
        return {"tensorflow_extension_error": _one_line(e)}
    return {
        "controllers": [c for c in ("gloo", "mpi") if getattr(hvd, f"{c}_built")()],
        "tensor_ops": [op for op in _TENSOR_OPS if getattr(hvd, f"{op}_built")()],
        "cuda_built": bool(hvd.cuda_built()),
        "rocm_built": bool(hvd.rocm_built()),
    }


def _nvidia_smi_gpus() -> int | None:
    """GPUs the driver lists for this process (horovodrun.count_gpus), or None without
    nvidia-smi."""
    return count_gpus() if shutil.which("nvidia-smi") else None


def _mpirun() -> dict[str, Any] | None:
    path = shutil.which("mpirun")
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
        version = (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        version = "unknown"
    return {"path": path, "version": version}


def _framework_versions(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The framework versions of Horovod's build record, without its placeholder entries
    (Horovod writes `"dummy": "none"` beside them)."""
    if metadata is None:
        return None
    return {k: v for k, v in metadata.items() if k in _FRAMEWORK_LIBS and v != "none"}


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


# --------------------------------------------------------------------------- diagnosis


def diagnose(facts: dict[str, Any]) -> list[Problem]:
    """The known-bad combinations in `facts`, errors first. Pure: no imports, no I/O."""
    problems = [
        *_python_problems(facts),
        *_tensorflow_problems(facts),
        *_horovod_problems(facts),
        *_device_problems(facts),
    ]
    return sorted(problems, key=lambda p: p.level != "error")


def _python_problems(facts: dict[str, Any]) -> list[Problem]:
    # A TensorFlow with no stack of its own (or none) is warned about on its own: here only a
    # Python that no stack has wheels for.
    stack = ".".join(map(str, version_tuple(facts["tensorflow"].get("version"))[:2]))
    newest = NEWEST_PYTHON.get(stack, max(NEWEST_PYTHON.values()))
    if (3, 10) <= version_tuple(facts["python"])[:2] <= (3, newest):
        return []
    return [Problem("warning", f"Python {facts['python']}: hvd_train supports {PYTHONS_TEXT}")]


def _tensorflow_problems(facts: dict[str, Any]) -> list[Problem]:
    tf = facts["tensorflow"]
    if tf.get("version") is None:
        return [Problem("error", f"TensorFlow does not import: {tf.get('error')}; run scripts/install.sh")]  # fmt: skip
    v, keras, tf_keras = (
        version_tuple(tf["version"]),
        tf.get("keras") or "",
        tf.get("tf_keras") or "",
    )
    minor = ".".join(map(str, v[:2]))
    how = (
        f"HVD_TRAIN_TF={minor} scripts/install.sh"
        if minor in STACKS
        else f"or HVD_TRAIN_TF={STACKS[-1]} scripts/install.sh: TensorFlow "
        f"{SUPPORTED_TENSORFLOW[-1]} with Keras 3 and tf_keras"
    )
    out = []
    if v >= (2, 16) and version_tuple(keras.rpartition(" ")[2])[:1] < (3,):
        out.append(Problem("error", f"Keras 3 does not import (TensorFlow {tf['version']}: {keras or tf.get('keras_error')}): models of runtime.keras: auto and keras cannot train; install Keras 3 ({how})"))  # fmt: skip
    if v >= (2, 16) and not tf_keras:
        out.append(Problem("warning", f"no tf_keras (TensorFlow {tf['version']}): runtime.keras: tf_keras (Keras 2) cannot train here; install tf_keras {minor} ({how})"))  # fmt: skip
    if tf_keras and version_tuple(tf_keras[9:])[:2] != v[:2]:
        out.append(Problem("warning", f"{tf_keras} with TensorFlow {tf['version']}: tf_keras should match TensorFlow's minor version"))  # fmt: skip
    if not any(
        tf["version"] == ok or tf["version"].startswith(f"{ok}.") for ok in SUPPORTED_TENSORFLOW
    ):
        out.append(Problem("warning", f"TensorFlow {tf['version']}: hvd_train is tested with {SUPPORTED_TEXT}"))  # fmt: skip
    return out


def _horovod_problems(facts: dict[str, Any]) -> list[Problem]:
    hv, tf_version = facts["horovod"], facts["tensorflow"].get("version")
    if hv.get("version") is None:
        return [Problem("error", f"Horovod does not import: {hv.get('error')}; run scripts/install.sh")]  # fmt: skip
    out = []
    built = (hv.get("built_against") or {}).get("tensorflow")
    if built and tf_version and built != tf_version:
        out.append(Problem("error", f"Horovod {hv['version']} was built against TensorFlow {built}, but TensorFlow {tf_version} is installed: rebuild Horovod against it (scripts/install.sh does, from its source with hvd_train's patches: patches/horovod-0.28.1)"))  # fmt: skip
    elif not built and "tensorflow" in hv.get("frameworks", []):
        out.append(Problem("warning", f"Horovod has no record of the TensorFlow it was built against ({hv.get('path')}/metadata.json)"))  # fmt: skip
    if "tensorflow" not in hv.get("frameworks", []):
        out.append(Problem("error", "Horovod was built without TensorFlow support: rebuild with HOROVOD_WITH_TENSORFLOW=1 (scripts/install.sh)"))  # fmt: skip
    elif hv.get("tensorflow_extension_error"):
        out.append(Problem("error", f"horovod.tensorflow does not load: {hv['tensorflow_extension_error']}; rebuild Horovod against the installed TensorFlow (scripts/install.sh)"))  # fmt: skip
    else:
        out += _controller_problems(hv.get("controllers", []), facts["mpirun"])
    if hv.get("keeps_stop_exit_code") is False:
        out.append(Problem("warning", f"horovodrun may exit 0 after Ctrl-C or SIGTERM (Horovod 0.28.1 can lose a stopped worker's exit code; {layout.SUMMARY} still says interrupted): scripts/install.sh builds Horovod with hvd_train's patches (patches/horovod-0.28.1), which fix it"))  # fmt: skip
    if hv["version"].partition("+")[0] != TESTED_HOROVOD:  # a local label is hvd_train's series
        out.append(Problem("warning", f"Horovod {hv['version']}: hvd_train is tested with {TESTED_HOROVOD}"))  # fmt: skip
    return out


def _controller_problems(controllers: list[str], mpirun: dict[str, Any] | None) -> list[Problem]:
    if "gloo" not in controllers and ("mpi" not in controllers or mpirun is None):
        return [Problem("error", "no usable controller: Horovod was built without Gloo, and MPI is " + ("not built" if "mpi" not in controllers else "built but mpirun is not on PATH"))]  # fmt: skip
    if "mpi" in controllers and mpirun is None:
        return [Problem("warning", "mpirun is not on PATH: only the Gloo controller works (no --mpi)")]  # fmt: skip
    if "mpi" not in controllers:
        return [Problem("warning", "Horovod was built without MPI: only the Gloo controller works")]  # fmt: skip
    return []


def _device_problems(facts: dict[str, Any]) -> list[Problem]:
    tf_gpus = len(facts["tensorflow"].get("gpus") or [])
    smi, out = facts["nvidia_smi_gpus"], []
    if smi and not tf_gpus and facts["tensorflow"].get("version"):
        cuda = facts["tensorflow"].get("built_with_cuda")
        why = (
            "CUDA libraries were not found"
            if cuda
            else "the CPU-only TensorFlow wheel is installed"
        )
        out.append(Problem("warning", f"nvidia-smi lists {smi} GPU(s) but TensorFlow sees none ({why}): a run fails at its start (runtime.device: auto); HVD_TRAIN_DEVICE=gpu scripts/install.sh installs the CUDA build, or runtime.device: cpu trains on the CPU"))  # fmt: skip
    ops = facts["horovod"].get("tensor_ops")
    if tf_gpus and ops is not None and "nccl" not in ops:
        out.append(Problem("warning", "TensorFlow sees GPUs but Horovod was built without NCCL: gradients go through host memory; rebuild with HOROVOD_GPU_OPERATIONS=NCCL (HVD_TRAIN_DEVICE=gpu scripts/install.sh)"))  # fmt: skip
    return out


# --------------------------------------------------------------------------- output


def versions_line(facts: dict[str, Any]) -> str:
    """`hvd_train=0.1.0 tensorflow=2.15.1 horovod=0.28.1`: what multi_node.sh compares."""
    return " ".join(
        f"{name}={version or 'missing'}"
        for name, version in (
            ("hvd_train", facts["hvd_train"]),
            ("tensorflow", facts["tensorflow"].get("version")),
            ("horovod", facts["horovod"].get("version")),
        )
    )


def render(facts: dict[str, Any], problems: list[Problem]) -> str:
    """The human-readable report."""
    tf, hv, mpi = facts["tensorflow"], facts["horovod"], facts["mpirun"]
    built = (hv.get("built_against") or {}).get("tensorflow") or "unknown"
    smi = facts["nvidia_smi_gpus"]
    lines = [
        f"python       {facts['python']} ({facts['python_executable']})",
        f"hvd_train    {facts['hvd_train']}",
        f"tensorflow   {tf.get('version') or 'missing'}"
        + (f" ({_kerases(tf)}, built with CUDA: {_yes(tf.get('built_with_cuda'))})" if tf.get("version") else ""),
        f"horovod      {hv.get('version') or 'missing'}"
        + (f", built against TensorFlow {built}" if hv.get("version") else ""),
        f"  patches      {hv.get('patches') or 'none (not built by scripts/install.sh)'}",
        f"  frameworks   {_list(hv.get('frameworks'))}",
        f"  controllers  {_list(hv.get('controllers'))}",
        f"  tensor ops   {_list(hv.get('tensor_ops'))} (NCCL: {_yes('nccl' in (hv.get('tensor_ops') or []))})",
        f"GPUs         TensorFlow sees {len(tf.get('gpus') or [])}; nvidia-smi: "
        + ("not found" if smi is None else f"{smi} GPU(s)"),
        f"MPI          {mpi['version']} ({mpi['path']})" if mpi else "MPI          mpirun not found",
    ]  # fmt: skip
    lines += [f"{p.level}: {p.message}" for p in problems]
    errors = sum(p.level == "error" for p in problems)
    lines.append(
        f"NOT READY: {errors} error(s): training cannot work here" if errors else "ready to train"
    )
    return "\n".join(lines)


def _kerases(tf: dict[str, Any]) -> str:
    """`keras 3.15.1, tf_keras 2.21.0`: the Kerases that import."""
    return ", ".join(filter(None, (tf.get("keras"), tf.get("tf_keras")))) or "no Keras"


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _list(items: list[str] | None) -> str:
    return ", ".join(items) if items else "none"


def main(argv: list[str] | None = None, prog: str = "hvd-train doctor") -> int:
    """Prints the report (or JSON, or the versions line); exit 1 when training cannot work."""
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.splitlines()[0], epilog="Docs: docs/install.md"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print facts and problems as JSON")
    out.add_argument(
        "--versions", action="store_true",
        help="print one line `hvd_train=X tensorflow=Y horovod=Z` (problems go to stderr); "
        "TensorFlow's and Horovod's facts are those of the last check of an unchanged install",
    )  # fmt: skip
    args = p.parse_args(argv)
    facts = gather(remembered=args.versions)
    problems = diagnose(facts)
    ok = not any(p.level == "error" for p in problems)
    if args.json:
        print(json.dumps({"ok": ok, "facts": facts, "problems": [asdict(p) for p in problems]}, indent=2))  # fmt: skip
    elif args.versions:
        print(versions_line(facts))
        for problem in problems:
            print(f"{problem.level}: {problem.message}", file=sys.stderr)
    else:
        print(render(facts, problems))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(prog="python -m hvd_train.commands.doctor"))
