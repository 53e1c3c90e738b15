"""Static checks of the Dockerfile, the Kubernetes manifests and the sbatch template (no cluster
here). The image itself is built and run by `make docker-test` (scripts/docker_test.sh), and
Slurm by `make slurm-test` (scripts/slurm_test.sh), outside `make test`; of the first script,
only its lookup of apt's Debian mirror runs here, on apt sources made for the test. Linters
from PyPI (hadolint, shellcheck), schema checks of the manifests (the MPIJob CRD's own OpenAPI
schema, shipped in launch/k8s/schema/; kubernetes-validate for core objects), plus the facts that
tie the pieces together: the image installs with the README's script, the manifests mount the
config where the command reads it, and the GPU and slot counts agree."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from harness import BIN, ROOT

from hvd_train.config import load_config

DOCKERFILE = ROOT / "Dockerfile"
K8S = ROOT / "launch" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
MPIJOB_SCHEMA = K8S / "schema" / "mpijob-v2beta1.json"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run([str(BIN / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.processes
def test_launch_scripts_pass_shellcheck() -> None:
    scripts = sorted(str(p) for p in (ROOT / "launch").glob("*.sh"))
    scripts += [
        str(ROOT / "scripts" / n)
        for n in ("docker_test.sh", "slurm_test.sh", "gpu_toolkit.sh", "gpu_test.sh")
    ]
    scripts.append(str(ROOT / "launch" / "slurm.sbatch"))
    proc = subprocess.run([str(BIN / "shellcheck"), "-x", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_defaults_to_the_default_stacks_cuda_devel_with_a_cpu_build_arg() -> None:
    """The default stack, TensorFlow 2.21, built on CUDA 12.5's devel image and run on its
    runtime image (2.15: 12.2's); BASE_IMAGE given is both stages' base unless RUNTIME_IMAGE is
    given too. What the engine resolves is `make docker-test`'s `bases` step."""
    steps = dockerfile_instructions()
    assert ("ARG", "TF=2.21") in steps
    assert ("ARG", "BASE_IMAGE") in steps and ("ARG", "RUNTIME_IMAGE") in steps
    froms = [a for w, a in steps if w == "FROM"]
    assert froms == ["${BUILD_FROM} AS build", "${RUNTIME_FROM}"], froms
    build = "BUILD_FROM=${BASE_IMAGE:-nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04}"
    runtime = "RUNTIME_FROM=${RUNTIME_IMAGE:-${BASE_IMAGE:-nvidia/cuda:12.5.1-runtime-ubuntu22.04}}"
    assert ("ARG", build) in steps and ("ARG", runtime) in steps
    assert ("ARG", "DEVICE=gpu") in steps
    header = DOCKERFILE.read_text()
    assert "--build-arg BASE_IMAGE=debian:bookworm-slim --build-arg DEVICE=cpu" in header


def test_cuda_home_is_set_for_the_gpu_build_only() -> None:
    # Set, HOROVOD_CUDA_HOME makes Horovod's CMake require nvcc: the CPU build failed with
    # "Failed to find nvcc" while the Dockerfile set it for every build (issue 15).
    steps = dockerfile_instructions()
    assert not any("HOROVOD_CUDA_HOME" in args for word, args in steps if word != "RUN")
    runs = [args for word, args in steps if word == "RUN" and "HOROVOD_CUDA_HOME" in args]
    assert len(runs) == 1
    assert re.search(r'if \[ "\$DEVICE" = gpu \]; then export HOROVOD_CUDA_HOME=', runs[0])


def test_image_installs_with_the_readmes_install_script() -> None:
    runs = [args for word, args in dockerfile_instructions() if word == "RUN"]
    assert any("HVD_TRAIN_DEVICE=${DEVICE} bash scripts/install.sh" in r for r in runs)
    assert "scripts/install.sh" in (ROOT / "README.md").read_text()
    assert "scripts/install.sh" in (ROOT / "Makefile").read_text()  # what CI's `make test` runs
    build, runtime = (r for r in runs if "apt-get install" in r)
    for package in ("openmpi-bin", "libopenmpi-dev", "python3-venv", "python3-dev", "g++"):
        assert package in build, package
    for package in ("openmpi-bin", "openssh-server", "openssh-client", "python3 "):
        assert package in runtime, package
    # On GPU, what NCCL's InfiniBand transport opens; without it NCCL falls back to sockets.
    assert 'if [ "$DEVICE" = gpu ]; then rdma=(libibverbs1 ibverbs-providers librdmacm1)' in runtime
    assert '"${rdma[@]}"' in runtime


def test_the_image_is_a_runtime_stage_with_the_built_virtualenv_and_no_compilers() -> None:
    """Horovod compiles in the build stage; the image gets its virtualenv at the same path and
    only runtime packages: no compiler, headers or build caches."""
    steps = dockerfile_instructions()
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    runs = " ".join(a for w, a in runtime if w == "RUN")
    for build_only in ("g++", "-dev", "make ", "install.sh"):
        assert build_only not in runs, build_only
    copies = [a for w, a in runtime if w == "COPY"]
    assert copies[0] == "--from=build --chown=1000:1000 /opt/hvd_train /opt/hvd_train", copies
    assert copies[-1] == "--chown=1000:1000 . /opt/hvd_train", copies


def test_install_layer_comes_before_the_rest_of_the_project() -> None:
    # Editing the code, a config or a launch script must not rebuild TensorFlow and Horovod: the
    # install runs on the files it reads (the package is installed editable, from an empty
    # hvd_train/), and the whole project is copied after it.
    steps = dockerfile_instructions()
    install = next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "install.sh" in a)
    copies = {a: i for i, (w, a) in enumerate(steps) if w == "COPY"}
    whole = copies["--chown=1000:1000 . /opt/hvd_train"]
    assert whole > install
    before = [a for a, i in copies.items() if i < install]
    for needed in ("pyproject.toml", "scripts/install.sh"):
        assert any(needed in a for a in before), needed
    assert not any(w in a for a in before for w in ("README", " . ", "hvd_train ")), before
    assert "pip install -q -e" in (ROOT / "scripts" / "install.sh").read_text()


def test_image_runs_the_quickstart_by_default() -> None:
    cmd = [args for word, args in dockerfile_instructions() if word == "CMD"]
    assert len(cmd) == 1
    argv = json.loads(cmd[0])
    assert argv == ["launch/single_node.sh", "configs/quickstart.yaml"]
    assert all((ROOT / p).exists() for p in argv)
    workdir = [args for word, args in dockerfile_instructions() if word == "WORKDIR"]
    assert workdir[-1] == "/opt/hvd_train"


def test_image_ssh_setup_suits_the_mpi_operator() -> None:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for needed in ("mkdir -p /var/run/sshd", "'StrictModes no'", "'    StrictHostKeyChecking no'",
                   "'    UserKnownHostsFile /dev/null'", "'HostKey /home/mpiuser/.ssh/id_rsa'"):  # fmt: skip
        assert needed in text, needed
    users = [args for word, args in dockerfile_instructions() if word == "USER"]
    assert users == ["1000:1000"] and "--uid 1000" in text and "mpiuser" in text


def test_dockerignore_keeps_the_host_venv_and_results_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "runs", ".git", "build"} <= set(ignored)


@pytest.mark.parametrize("target", ["docker-test", "slurm-test"])
def test_docker_and_slurm_tests_are_make_targets_outside_make_test(target) -> None:
    makefile = (ROOT / "Makefile").read_text()
    script = f"scripts/{target.replace('-', '_')}.sh"
    found = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert found and script in found.group(1)
    test_deps = re.search(r"^test: (?!export).*$", makefile, re.M).group(0)
    assert "docker" not in test_deps and "slurm" not in test_deps


def test_the_slurm_template_stops_on_slurms_warning_and_requeues() -> None:
    """launch/slurm.sbatch asks for the warning and the requeue, runs `hvd-train launch
    --slurm`, and is the script scripts/slurm_test.sh submits."""
    text = (ROOT / "launch" / "slurm.sbatch").read_text()
    options = re.findall(r"^#SBATCH (\S+)", text, re.M)
    for needed in ("--nodes=2", "--ntasks-per-node=1", "--signal=B:USR1@120", "--requeue",
                   "--open-mode=append"):  # fmt: skip
        assert needed in options, options
    assert 'setsid hvd-train launch --slurm --config "$@" &' in text
    assert "trap " in text and "USR1" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert re.search(r"\[ \"\$code\" = 138 \]", text)  # 128 + SIGUSR1: the launcher's stop
    assert "launch/slurm.sbatch" in (ROOT / "scripts" / "slurm_test.sh").read_text()


DEB822 = "Types: deb\nURIs: {}\nSuites: bookworm bookworm-updates\nComponents: main\n"
CLASSIC = (
    "# deb http://commented.example/debian bookworm main\n"
    "deb-src http://source.example/debian bookworm main\n"
    "deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] {} bookworm main\n"
)


@pytest.mark.parametrize(
    ("files", "mirror"),
    [
        ({"sources.list.d/debian.sources": DEB822.format("http://deb822.example/debian")},
         "http://deb822.example/debian"),
        ({"sources.list": CLASSIC.format("http://classic.example/debian/")},
         "http://classic.example/debian/"),
        ({"sources.list.d/debian.sources": DEB822.format("http://deb822.example/debian"),
          "sources.list": CLASSIC.format("http://classic.example/debian")},
         "http://deb822.example/debian"),
        ({}, "http://deb.debian.org/debian"),
        ({"sources.list.d/debian.sources": DEB822.format(
            "http://archive.ubuntu.com/ubuntu http://deb822.example/debian")},
         "http://deb822.example/debian"),
    ],
    ids=["deb822-only", "classic-only", "both", "neither", "deb822-debian-uri-second"],
)  # fmt: skip
def test_docker_test_debootstraps_from_one_mirror_whatever_apts_sources(
    tmp_path, files, mirror
) -> None:
    """`docker_test.sh mirror` prints one Debian mirror: deb822 sources first, then a classic
    sources.list, else deb.debian.org; never a second line (a missing sources.list did that)."""
    apt = tmp_path / "etc" / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (apt / name).write_text(text)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "docker_test.sh"), "mirror"],
        env={**os.environ, "APT_SOURCES_ROOT": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, mirror + "\n", ""), proc


# --------------------------------------------------------------------------- Kubernetes


def documents() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


def mpijobs() -> list[tuple[str, dict]]:
    return [(name, d) for name, d in documents() if d["kind"] == "MPIJob"]


def config_maps() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == "ConfigMap"}


def test_manifests_exist_and_parse() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"configmap.yaml", "mpijob.yaml", "mpijob-elastic.yaml", "results-pvc.yaml"} <= names
    kinds = sorted(d["kind"] for _, d in documents())
    assert kinds.count("MPIJob") == 2 and "PersistentVolumeClaim" in kinds


def test_results_claim_lives_apart_from_the_jobs() -> None:
    # `kubectl delete -f mpijob.yaml` deletes what that file holds: the results must not be in it.
    claims = [name for name, d in documents() if d["kind"] == "PersistentVolumeClaim"]
    assert claims == ["results-pvc.yaml"]
    assert [d["kind"] for d in yaml.safe_load_all((K8S / "results-pvc.yaml").read_text())] == [
        "PersistentVolumeClaim"
    ]


def strict(schema: dict) -> dict:
    """The CRD's schema with unknown fields rejected, as `kubectl apply --validate=strict` does
    (the API server prunes them silently otherwise: a misspelt field would just be ignored)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def mpijob_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(json.loads(MPIJOB_SCHEMA.read_text())))


@pytest.mark.parametrize("name,job", mpijobs(), ids=lambda x: x if isinstance(x, str) else "")
def test_mpijob_matches_the_operators_crd_schema(name, job) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in mpijob_validator().iter_errors(job)]  # fmt: skip
    assert not errors, "\n".join(errors)


def test_mpijob_schema_check_catches_a_misspelt_field() -> None:
    (_, job) = next((n, j) for n, j in mpijobs() if n == "mpijob.yaml")
    bad = json.loads(json.dumps(job))
    bad["spec"]["slotPerWorker"] = bad["spec"].pop("slotsPerWorker")
    worker = bad["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["volumeMount"] = worker.pop("volumeMounts")
    paths = {".".join(map(str, e.absolute_path)) for e in mpijob_validator().iter_errors(bad)}
    assert "spec" in paths and "spec.mpiReplicaSpecs.Worker.template.spec.containers.0" in paths


@pytest.mark.parametrize(
    "version", [kubernetes_validate.utils.all_versions()[0], kubernetes_validate.latest_version()]
)
def test_core_objects_match_the_kubernetes_schema(version) -> None:
    core = [(name, d) for name, d in documents() if d["apiVersion"] == "v1"]
    assert {d["kind"] for _, d in core} == {"ConfigMap", "PersistentVolumeClaim"}
    for name, doc in core:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.utils.ValidationError as e:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e}")
    bad = {**core[0][1], "metdata": {}}
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


@pytest.mark.parametrize("name,job", mpijobs(), ids=lambda x: x if isinstance(x, str) else "")
def test_mpijob_is_v2beta1_with_gpu_workers_and_slots(name, job) -> None:
    assert job["apiVersion"] == "kubeflow.org/v2beta1"
    spec = job["spec"]
    slots = spec["slotsPerWorker"]
    replicas = spec["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"} and replicas["Launcher"]["replicas"] == 1
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == slots, "one worker process per GPU"
    assert worker["command"] == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    assert spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"  # the image's non-root user
    for role in replicas.values():
        assert role["template"]["spec"]["securityContext"]["runAsUser"] == 1000


@pytest.mark.parametrize("name,job", mpijobs(), ids=lambda x: x if isinstance(x, str) else "")
def test_each_worker_pod_runs_one_worker_per_gpu_it_requests(name, job) -> None:
    """Issue 60: slots per worker pod = the GPUs it requests, and the launcher starts no more
    workers than the pods hold GPUs (elastic: as many slots a host)."""
    spec = job["spec"]
    slots, workers = spec["slotsPerWorker"], spec["mpiReplicaSpecs"]["Worker"]
    resources = workers["template"]["spec"]["containers"][0]["resources"]
    asked = {resources.get(kind, {}).get("nvidia.com/gpu") for kind in ("limits", "requests")}
    assert asked - {None} == {slots}, f"{name}: nvidia.com/gpu {asked} for {slots} slots"
    argv = launcher_argv(job)
    gpus = workers["replicas"] * slots
    if "--host-discovery-script" in argv:
        assert int(flag(argv, "--slots-per-host")) == slots
        assert int(flag(argv, "--max-np")) <= gpus
    else:
        assert int(flag(argv, "-np")) == gpus, f"{name}: -np is not replicas x slotsPerWorker"


def launcher_argv(job: dict) -> list[str]:
    c = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    return [*c["command"], *c["args"]]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def mounted_config(job: dict, role: str) -> tuple[str, dict]:
    """(mount path, ConfigMap) of the config volume in `role`'s pod."""
    pod = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    return mount["mountPath"], config_maps()[volume["configMap"]["name"]]


@pytest.mark.parametrize("name,job", mpijobs(), ids=lambda x: x if isinstance(x, str) else "")
def test_workers_read_the_config_where_the_command_says(name, job, tmp_path) -> None:
    argv = launcher_argv(job)
    assert argv[0] == "horovodrun" and argv[argv.index("python") :][:3] == [
        "python",
        "-m",
        "hvd_train",
    ]
    config_path = pathlib.PurePosixPath(flag(argv, "--config"))
    for role in ("Launcher", "Worker"):
        mount, cm = mounted_config(job, role)
        assert str(config_path.parent) == mount and config_path.name in cm["data"], role
    # The ConfigMap's config is a valid hvd_train config, writing to the results volume.
    _, cm = mounted_config(job, "Worker")
    tree = yaml.safe_load(cm["data"][config_path.name])
    pod = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    results = next(
        m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == "results"
    )
    assert tree["run"]["dir"].startswith(results + "/")
    path = tmp_path / config_path.name
    path.write_text(yaml.safe_dump(tree))
    load_config(path)


def test_mpijob_starts_one_process_per_gpu() -> None:
    (_, job) = next((n, j) for n, j in mpijobs() if n == "mpijob.yaml")
    spec = job["spec"]
    argv = launcher_argv(job)
    np = int(flag(argv, "-np"))
    assert np == spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert flag(argv, "--hostfile") == "/etc/mpi/hostfile" and "--mpi" in argv
    first_line = config_maps()["hvd-train-config"]["data"]["train.yaml"].splitlines()[0]
    assert shlex.split(first_line.lstrip("# ")) == argv, "the config opens with its launch command"


def test_elastic_mpijob_matches_its_config() -> None:
    (_, job) = next((n, j) for n, j in mpijobs() if n == "mpijob-elastic.yaml")
    argv = launcher_argv(job)
    _, cm = mounted_config(job, "Worker")
    elastic = yaml.safe_load(cm["data"]["train.yaml"])["elastic"]
    assert elastic["enabled"] is True
    assert int(flag(argv, "--min-np")) == elastic["min_workers"]
    assert int(flag(argv, "--max-np")) == elastic["max_workers"]
    assert flag(argv, "--host-discovery-script") == "/etc/mpi/discover_hosts.sh"
    assert elastic["discovery_script"] == "/etc/mpi/discover_hosts.sh"
    spec = job["spec"]
    assert int(flag(argv, "--slots-per-host")) == spec["slotsPerWorker"]
    capacity = spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert elastic["min_workers"] <= int(flag(argv, "-np")) <= elastic["max_workers"] <= capacity


def test_results_claim_exists_for_every_job() -> None:
    claims = {d["metadata"]["name"] for _, d in documents() if d["kind"] == "PersistentVolumeClaim"}
    for _, job in mpijobs():
        pod = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        used = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]  # fmt: skip
        assert used and set(used) <= claims
