#!/usr/bin/env python3
"""Checks Horovod's GPU build on a machine without a GPU: `make gpu-build-check`.

For each TensorFlow stack (scripts/stack.sh; HVD_TRAIN_TF=2.21 picks one, all by default):
Horovod 0.28.1's sdist with this stack's patch series is compiled with g++ and the switches its
CMake sets for a CUDA build with NCCL, MPI and Gloo, against the headers of TensorFlow's CUDA
wheel and of the CUDA runtime and NCCL wheels its `and-cuda` extra names. Then every TensorFlow
symbol the objects leave undefined must be exported by one of that wheel's libraries: one that
is not would make `import horovod.tensorflow` fail on every GPU host. One result line a stack;
exit status 1 when a stack fails.

Left out: Horovod's .cu kernels (they need nvcc, and reference no TensorFlow symbol) and NVTX
(optional in Horovod's build). The wheels are downloaded once (about 600 MB a stack) and kept
under $HVD_TRAIN_CACHE/gpu-build-check (default ~/.cache/hvd_train), keyed by their versions.
Not part of `make test`: the download and the compile take minutes (docs/install.md).
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
STACKS = ("2.21", "2.20", "2.19", "2.18", "2.15")
# Namespaces only TensorFlow's libraries define (absl and protobuf come inside its wheel).
TF_NAMESPACE = re.compile(r"(?<![\w:])(tensorflow|stream_executor|tsl|xla|absl|google::protobuf)::")
TF_C_API = re.compile(r"^(TF|TFE|TF_Tstring)_\w+$")
# Sources in Horovod's CMake lists that a CUDA + NCCL + MPI + Gloo build leaves out.
NOT_BUILT = {"ccl_operations.cc", "hip_operations.cc", "ddl_operations.cc",
             "ddl_mpi_context_manager.cc", "nvtx_op_range.cc"}  # fmt: skip
# The CUDA wheels whose headers the sources include: cuda_runtime.h, its crt/ headers (in the
# nvcc wheel) and nccl.h.
HEADER_WHEELS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-nccl-cu12")


def cache_dir() -> pathlib.Path:
    """Where the wheels and what is unpacked from them are kept."""
    base = os.environ.get("HVD_TRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvd_train"
    )
    return pathlib.Path(base, "gpu-build-check")


def is_tensorflows(demangled: str) -> bool:
    """Whether a symbol can only come from TensorFlow's libraries (by its namespace)."""
    return bool(TF_NAMESPACE.search(demangled) or TF_C_API.match(demangled))


def parse_nm(text: str, kinds: str = "") -> set[str]:
    """The symbol names of `nm -P` output, without a version suffix (`name@@VERS`); only
    those of the types in `kinds` when given (`U`: a weak undefined symbol, `w`, may stay
    unresolved when the library loads)."""
    names = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and (not kinds or fields[1] in kinds):
            names.add(fields[0].split("@")[0])
    return names


def missing_symbols(
    undefined: dict[str, set[str]],
    defined: set[str],
    exported: set[str],
    demangled: dict[str, str],
) -> dict[str, list[str]]:
    """Each object's TensorFlow symbols that neither another object nor TensorFlow defines.

    Args:
        undefined: an object's name to the (mangled) symbols it leaves undefined.
        defined: every symbol the compiled objects define themselves.
        exported: every symbol TensorFlow's libraries export.
        demangled: a mangled name to its demangled form (c++filt).
    Returns:
        The object's name to its missing symbols, demangled and sorted; objects that miss
        none are left out.
    """
    missing = {}
    for obj, names in sorted(undefined.items()):
        lost = sorted(
            demangled.get(n, n)
            for n in names - defined - exported
            if is_tensorflows(demangled.get(n, n))
        )
        if lost:
            missing[obj] = lost
    return missing


def sh(cmd: list[str], **kw) -> str:
    """Runs a command and returns its stdout; its stderr's tail in the error when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def stack_env(stack: str) -> dict[str, str]:
    """scripts/stack.sh's variables for a stack (TF_VERSION, XLA_OPS, STACK_PYTHONS)."""
    out = sh(["bash", "-c", ". scripts/stack.sh && stack_select && "
              'echo "$TF_VERSION|$XLA_OPS|$STACK_PYTHONS"'],
             cwd=ROOT, env={**os.environ, "HVD_TRAIN_TF": stack})  # fmt: skip
    version, xla_ops, pythons = out.strip().split("|")
    return {"TF_VERSION": version, "XLA_OPS": xla_ops, "STACK_PYTHONS": pythons}


def python_tag(pythons: str) -> str:
    """The wheel's Python: this one when the stack has wheels for it, else its newest."""
    mine = "%d.%d" % sys.version_info[:2]
    chosen = mine if mine in pythons.split() else pythons.split()[-1]
    return chosen


def download(spec: str, python: str, dest: pathlib.Path) -> pathlib.Path:
    """The Linux x86_64 wheel for `spec`, downloaded into `dest` unless one is there."""
    name, _, version = spec.partition("==")
    tag = "cp" + python.replace(".", "")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = (
        [p for p in dest.glob(pattern) if tag in p.name or "py3-none" in p.name] if version else []
    )
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download.") as tmp:
        print(f"[gpu-build-check] downloading {spec} (once: kept in {cache_dir()})", flush=True)
        platforms = ["manylinux_2_27_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"]
        sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
            ":all:", "--python-version", python, *[f"--platform={p}" for p in platforms],
            "-d", tmp, spec])  # fmt: skip
        [wheel] = pathlib.Path(tmp).glob("*.whl")
        return wheel.rename(dest / wheel.name)  # a rename: never half a wheel in the cache


def unpack(wheel: pathlib.Path, dest: pathlib.Path, keep) -> pathlib.Path:
    """The members of `wheel` that `keep(name)` accepts, unpacked once into `dest`."""
    done = dest / ".complete"
    if not done.exists():
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest, [m for m in zf.namelist() if keep(m)])
        done.touch()
    return dest


def tensorflow_wheel(version: str, python: str) -> pathlib.Path:
    """TensorFlow's CUDA wheel, its headers and libraries unpacked (and its METADATA)."""
    wheel = download(f"tensorflow=={version}", python, cache_dir() / "wheels")

    def keep(name: str) -> bool:
        return (name.startswith("tensorflow/include/") or ".so" in name
                or name.endswith(".dist-info/METADATA"))  # fmt: skip

    return unpack(wheel, cache_dir() / f"tensorflow-{version}-cp{python.replace('.', '')}", keep)


def cuda_specs(tf_dir: pathlib.Path) -> list[str]:
    """The header wheels' requirements as TensorFlow's `and-cuda` extra pins them."""
    [metadata] = tf_dir.glob("*.dist-info/METADATA")
    specs = {}
    for line in metadata.read_text().splitlines():
        m = re.match(
            r"Requires-Dist: ([\w-]+)\s*\(?([^;)]*)\)?\s*;.*extra == [\"']and-cuda[\"']", line
        )
        if m and m.group(1) in HEADER_WHEELS:
            specs[m.group(1)] = m.group(1) + m.group(2).replace(" ", "")
    return [specs[name] for name in HEADER_WHEELS]


def header_wheels(specs: list[str], python: str) -> list[str]:
    """The header wheels' exact versions: TensorFlow's ranges as pip resolves them, and CCCL
    (cuda_fp16.h includes its <nv/target>; not in TensorFlow's extra) of the runtime's CUDA."""
    exact = [pinned(spec, python) for spec in specs]
    runtime = exact[HEADER_WHEELS.index("nvidia-cuda-runtime-cu12")].split("==")[1]
    cuda = ".".join(runtime.split(".")[:2])
    return [*exact, f"nvidia-cuda-cccl-cu12=={cuda}.*"]


def cuda_headers(wheels: list[str], python: str) -> tuple[list[pathlib.Path], list[str]]:
    """The include folders of the CUDA runtime, nvcc (crt/), NCCL and CCCL wheels, and each
    wheel's name and version (`cuda-runtime-cu12 12.9.79`)."""
    dirs, names = [], []
    for spec in wheels:
        wheel = download(spec, python, cache_dir() / "wheels")
        root = unpack(wheel, cache_dir() / wheel.stem, lambda m: "/include/" in m)
        found = sorted(root.glob("nvidia/*/include"))
        if not found:
            raise RuntimeError(f"{wheel.name} holds no nvidia/*/include")
        dirs += found
        name, version = wheel.name.split("-")[:2]
        names.append(f"{name.removeprefix('nvidia_').replace('_', '-')} {version}")
    return dirs, names


def pinned(spec: str, python: str) -> str:
    """A range (`>=12.5,<13`) resolved once to the version pip picks, then kept in the cache."""
    if "==" in spec:
        return spec
    key = cache_dir() / "resolved" / re.sub(r"[^\w.=<>,-]", "_", spec)
    if not key.exists():
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(spec, python, pathlib.Path(tmp))
            shutil.move(str(wheel), cache_dir() / "wheels" / wheel.name)
        key.parent.mkdir(parents=True, exist_ok=True)
        name = re.match(r"[\w-]+", spec).group(0)
        key.write_text(f"{name}=={wheel.name.split('-')[1]}")
    return key.read_text()


def horovod_source(stack: str, work: pathlib.Path) -> pathlib.Path:
    """Horovod's sdist with the stack's patch series applied, as the install builds it."""
    series = str(ROOT / "scripts" / "horovod_series.sh")
    env = {**os.environ, "HVD_TRAIN_TF": stack}
    sdist = sh(["bash", series, "sdist", sys.executable], env=env).strip()
    with tarfile.open(sdist) as tar:
        # The "data" filter where this Python has it (3.11.4+; a distribution's 3.11.2 has not).
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(work, **safe)
    source = work / "horovod-0.28.1"
    sh(["bash", series, "apply", str(source)], env=env)
    gloo = source / "third_party" / "gloo" / "gloo"
    (gloo / "config.h").write_text(gloo_config((gloo / "config.h.in").read_text()))
    return source


def gloo_config(template: str) -> str:
    """Gloo's config.h as Horovod's CMake writes it: version 0.5.0, MPI and TCP on."""
    on = {"GLOO_USE_MPI", "GLOO_HAVE_TRANSPORT_TCP"}
    text = template.replace("@GLOO_VERSION_MAJOR@", "0").replace("@GLOO_VERSION_MINOR@", "5")
    text = text.replace("@GLOO_VERSION_PATCH@", "0")
    return re.sub(r"#cmakedefine01 (\w+)",
                  lambda m: f"#define {m.group(1)} {int(m.group(1) in on)}", text)  # fmt: skip


def sources(source: pathlib.Path) -> list[pathlib.Path]:
    """The .cc files of Horovod's CMake lists that a CUDA build compiles with g++."""
    found = []
    for cmake, folder in (("CMakeLists.txt", "common"), ("horovod/tensorflow/CMakeLists.txt",
                                                          "tensorflow")):  # fmt: skip
        text = (source / cmake).read_text()
        for path in re.findall(rf"horovod/{folder}/[\w/]+\.cc", text):
            if pathlib.Path(path).name not in NOT_BUILT and source / path not in found:
                found.append(source / path)
    return found


def compile_flags(source: pathlib.Path, tf_dir: pathlib.Path, tf_version: str,
                  cuda: list[pathlib.Path]) -> list[str]:  # fmt: skip
    """g++'s switches: Horovod's CMake for CUDA, NCCL, MPI and Gloo, and TensorFlow's own
    (tf.sysconfig.get_compile_flags())."""
    major, minor, patch = (int(x) for x in tf_version.split("."))
    nccl = str(ord("N"))  # CMake passes the operation's first letter as its ASCII code
    mpi = sh(["mpicxx", "--showme:incdirs"]).split()
    third = source / "third_party"
    includes = [third / "HTTPRequest/include", third / "lbfgs/include", third / "gloo",
                *sorted(third.glob("boost/*/include")), tf_dir / "tensorflow/include",
                third / "flatbuffers/include", *mpi, *cuda]  # fmt: skip
    # Last, for what the wheels lack: the CUDA headers TensorFlow's own build used, which it
    # ships. CCCL's 12.2 wheel (TensorFlow 2.15's CUDA) has no <nv/target>, which cuda_fp16.h
    # includes and CUDA 12.2's toolkit has.
    bundled = tf_dir / "tensorflow/include/third_party/gpus/cuda/include"
    includes += [bundled] if bundled.is_dir() else []
    return [
        "-std=c++17", "-O2", "-fPIC", "-pthread", "-mf16c", "-mavx", "-mfma", "-w",
        "-D_GLIBCXX_USE_CXX11_ABI=1", "-DEIGEN_MAX_ALIGN_BYTES=64", "-DEIGEN_MPL2_ONLY=1",
        "-DHAVE_CUDA=1", "-DHAVE_GPU=1", "-DHAVE_NCCL=1", "-DHAVE_MPI=1", "-DHAVE_GLOO=1",
        f"-DTENSORFLOW_VERSION={major * 10**9 + minor * 10**6 + patch * 10**3}",
        *[f"-DHOROVOD_GPU_{op}={nccl}"
          for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")],
        *[f"-I{d}" for d in includes],
    ]  # fmt: skip


def compile_all(
    files: list[pathlib.Path], flags: list[str], out: pathlib.Path
) -> list[pathlib.Path]:
    """Each source compiled to an object in `out`, as many at once as there are cores."""
    out.mkdir(parents=True, exist_ok=True)

    def one(src: pathlib.Path) -> pathlib.Path:
        obj = out / (src.stem + ".o")
        sh(["g++", *flags, "-c", str(src), "-o", str(obj)])
        return obj

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(one, files))


def exported_symbols(tf_dir: pathlib.Path) -> tuple[set[str], int]:
    """Every dynamic symbol TensorFlow's libraries define, and how many libraries there are;
    kept beside the unpacked wheel."""
    libs = sorted(p for p in tf_dir.rglob("*.so*") if p.is_file())
    kept = tf_dir / ".exported"
    if not kept.exists():
        names = set()
        for lib in libs:
            names |= parse_nm(sh(["nm", "-D", "-P", "--defined-only", str(lib)]))
        kept.write_text("\n".join(sorted(names)))
    return set(kept.read_text().split()), len(libs)


def demangle(names: set[str]) -> dict[str, str]:
    """c++filt's reading of each name."""
    ordered = sorted(names)
    out = sh(["c++filt"], input="\n".join(ordered) + "\n").splitlines()
    return dict(zip(ordered, out, strict=True))


def build(stack: str, tf_dir: pathlib.Path, tf_version: str, cuda: list[pathlib.Path]):
    """Compiles the stack's patched Horovod; (files compiled, each object's undefined
    symbols, the symbols the objects define)."""
    with tempfile.TemporaryDirectory(prefix="gpu-build-check.") as tmp:
        source = horovod_source(stack, pathlib.Path(tmp))
        files = sources(source)
        flags = compile_flags(source, tf_dir, tf_version, cuda)
        objects = compile_all(files, flags, pathlib.Path(tmp) / "obj")
        undefined = {o.name: parse_nm(sh(["nm", "-P", "-u", str(o)]), "U") for o in objects}
        defined = [parse_nm(sh(["nm", "-P", "--defined-only", str(o)])) for o in objects]
    return files, undefined, set().union(*defined)


def check_stack(stack: str) -> tuple[bool, str]:
    """Compiles and checks one stack; (passed, its result line). Prints each missing symbol."""
    env = stack_env(stack)
    tf_version, python = env["TF_VERSION"], python_tag(env["STACK_PYTHONS"])
    tf_dir = tensorflow_wheel(tf_version, python)
    cuda, cuda_names = cuda_headers(header_wheels(cuda_specs(tf_dir), python), python)
    what = f"tensorflow {tf_version} (cp{python.replace('.', '')}), {', '.join(cuda_names)}"
    try:
        files, undefined, defined = build(stack, tf_dir, tf_version, cuda)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return False, f"{stack}: FAILED to compile ({what})"
    exported, nlibs = exported_symbols(tf_dir)
    every = set().union(*undefined.values())
    names = demangle(every)
    needed = {n for n in every - defined if is_tensorflows(names[n])}
    missing = missing_symbols(undefined, defined, exported, names)
    for obj, lost in missing.items():
        for name in lost:
            print(f"  {stack}: {obj} needs {name}, which TensorFlow {tf_version} does not export")
    what = f"{len(files)} files compiled with HAVE_CUDA, HAVE_GPU, HAVE_NCCL; {what}"
    if missing:
        count = sum(map(len, missing.values()))
        return (
            False,
            f"{stack}: FAILED, {count} of {len(needed)} TensorFlow symbols missing ({what})",
        )
    return (
        True,
        f"{stack}: ok, {len(needed)} TensorFlow symbols, all exported by its {nlibs} libraries ({what})",
    )


def main() -> int:
    """Checks the stacks HVD_TRAIN_TF names (default: every supported one)."""
    chosen = os.environ.get("HVD_TRAIN_TF") or ""
    stacks = chosen.split(",") if chosen else list(STACKS)
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        print(f"HVD_TRAIN_TF={chosen}: choose from {', '.join(STACKS)}", file=sys.stderr)
        return 2
    results = []
    for stack in stacks:
        try:
            results.append(check_stack(stack))
        except RuntimeError as err:
            print(err, file=sys.stderr)
            results.append((False, f"{stack}: FAILED before the check (see above)"))
        print(f"[gpu-build-check] {results[-1][1]}", flush=True)
    print("[gpu-build-check] Horovod's .cu kernels are not compiled here (no nvcc), nor NVTX")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
