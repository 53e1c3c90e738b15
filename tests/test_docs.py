"""The README and docs/ say what the code does: the config reference and its JSON Schema are the
ones the schema generates, every command they show is one the CLI accepts (the cheap ones are
run), every config they show loads, and every link between the pages leads somewhere."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
from collections.abc import Iterator

import pytest
from harness import ROOT

from hvd_train import cli
from hvd_train.config import load_config, reference, schema_text

README = ROOT / "README.md"
LAB = ROOT / "lab"
# Each lab folder's README gives its commands as they run today; its other pages (runs.md)
# keep each run's command as it was then.
LAB_PAGES = sorted(LAB.rglob("*.md"))
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *LAB_PAGES]
SHOWING = [p for p in PAGES if p.parent.parent != LAB or p.name == "README.md"]
# Where measurements and records of runs live, with their dates and commits: nowhere else.
RECORDS = {"benchmarks.md", "validation.md"}


def is_record(page: pathlib.Path) -> bool:
    return page.name in RECORDS or page.is_relative_to(LAB)


FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
REPO_PATH = re.compile(r"(?:configs|examples|launch|scripts|lab|docs|tests)/[\w./-]+")


def fenced(lang: str) -> Iterator[tuple[str, str]]:
    """(where, text) of every ```lang block of the README, docs/ and the lab's READMEs, `where`
    as page:line."""
    for page in SHOWING:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                yield (
                    f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}",
                    m.group(2),
                )


def commands(block: str) -> Iterator[list[str]]:
    """Each command of a shell block, as words: continued lines joined, comments and leading
    `VAR=value` assignments dropped, split at `&&`, `;` and `|`."""
    for line in re.sub(r"\\\n", " ", block).splitlines():
        command: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:
            if word not in ("&&", "||", ";", "|"):
                command.append(word)
                continue
            while command and re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):
                command.pop(0)
            if command:
                yield command
            command = []


SHOWN = [(where, words) for where, block in fenced("bash") for words in commands(block)]


def hvd_train_args(words: list[str]) -> list[str] | None:
    """The arguments of the hvd_train command in `words` (alone, or under horovodrun, a wrapper
    or docker) as `hvd-train` takes them; None when the command runs no hvd_train."""
    for i, word in enumerate(words):
        if os.path.basename(word) == "hvd-train":
            return words[i + 1 :]
        if os.path.basename(word).startswith("python") and words[i + 1 : i + 2] == ["-m"]:
            module = words[i + 2] if len(words) > i + 2 else ""
            if module == "hvd_train":
                return words[i + 3 :]
            if module.startswith("hvd_train."):  # python -m hvd_train.config: `config`
                return [module.split(".", 1)[1], *words[i + 3 :]]
    return None


def command_name(args: list[str]) -> str | None:
    """The sub-command `args` run: None for the top-level help, `train` by default."""
    if not args or args[0] in cli.HELP_FLAGS:
        return None
    return args[0] if args[0] in cli.COMMANDS else "train"


def is_cheap(args: list[str]) -> bool:
    """A command that trains nothing and starts no job: help, config, doctor, a printed launch."""
    name = command_name(args)
    return (
        name is None
        or "--help" in args
        or "-h" in args
        or name in ("config", "doctor")
        or (name == "launch" and "--print-command" in args)
    )


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`hvd-train ARGV` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse's --help and usage errors
            code = e.code
    return code, out.getvalue(), err.getvalue()


def option_names(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def overrides(words: list[str]) -> list[str]:
    """The `--set KEY=VALUE` values among `words`."""
    found = [w.removeprefix("--set=") for w in words if w.startswith("--set=")]
    return found + [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]


def config_of(words: list[str]) -> str | None:
    """The config file a command reads, when it is one in the repository."""
    for i, w in enumerate(words):
        given = words[i + 1] if w == "--config" and i + 1 < len(words) else None
        given = given or (w if w.endswith(".yaml") and not w.startswith("-") else None)
        if given and (ROOT / given).is_file():
            return given
    return None


def case_id(item: tuple[str, list[str]]) -> str:
    where, words = item
    return f"{where} {shlex.join(words)[:70]}"


@pytest.mark.parametrize("item", SHOWN, ids=[case_id(i) for i in SHOWN])
def test_every_command_shown_is_one_the_code_accepts(item, monkeypatch) -> None:
    """Every shell command the README and docs/ show names real files, make targets, launch
    script options and hvd_train options, and the config it reads loads with its `--set`s."""
    where, words = item
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
    for path in REPO_PATH.findall(" ".join(words)):
        assert (ROOT / path).exists(), f"{where}: {path} does not exist"
    if words[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in words[1:]:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{where}: make {target}"
    script = next((w for w in words if re.fullmatch(r"launch/\w+\.sh", w)), None)
    if script:
        accepted = set(re.findall(r"(--[\w-]+)(?:=\*)?[|)]", (ROOT / script).read_text()))
        args = words[words.index(script) + 1 :]
        unknown = set(option_names(args)) - accepted
        assert not unknown, f"{where}: {script} has no option {sorted(unknown)}"
    args = hvd_train_args(words)
    if args is not None:
        name = command_name(args)
        assert name is None or name == "train" or args[0] == name
        _, help_text, _ = run_cli([name, "--help"] if name else ["--help"])
        for option in option_names(args):
            assert re.search(
                rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text
            ), f"{where}: `hvd-train {name or ''}` has no option {option}:\n{help_text}"
    config = config_of(args if args is not None else words)
    if config:
        load_config(config, overrides(words))


CHEAP = [(where, hvd_train_args(words)) for where, words in SHOWN if is_cheap(hvd_train_args(words) or ["train"])]  # fmt: skip


def _tiered(item: tuple[str, list[str]]):
    """The doctor probes this machine in processes of its own: those cases are `processes`."""
    doctor = command_name(item[1]) == "doctor"
    return pytest.param(item, id=case_id(item), marks=[pytest.mark.processes] if doctor else [])


@pytest.mark.parametrize("item", [_tiered(i) for i in CHEAP])
def test_every_cheap_command_shown_runs(item, monkeypatch) -> None:
    """The cheap commands the pages show (help, config, doctor, launch --print-command) run
    from the repository root and exit 0, exactly as written."""
    where, args = item
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
    if "--slurm" in args:  # shown as run inside an allocation: two nodes, Slurm's variables
        monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
        monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1(x2)")
    code, out, err = run_cli(args)
    assert code == 0, f"{where}: hvd-train {shlex.join(args)} exited {code}\n{out}\n{err}"
    assert out.strip(), f"{where}: hvd-train {shlex.join(args)} printed nothing"


def test_the_pages_show_each_kind_of_cheap_command() -> None:
    """The cheap commands run above include a help, a config, a doctor and a printed launch,
    so the check above cannot pass by finding none."""
    kinds = {"help" if {"--help", "-h"} & {*args} else command_name(args) or "help" for _, args in CHEAP}  # fmt: skip
    assert {"help", "config", "doctor", "launch"} <= kinds, kinds


CONFIGS = list(fenced("yaml"))


@pytest.mark.parametrize("item", CONFIGS, ids=[where for where, _ in CONFIGS])
def test_every_config_shown_loads(item, tmp_path) -> None:
    """Each YAML block of the pages is a config whose every key and value the loader accepts."""
    where, text = item
    path = tmp_path / "shown.yaml"
    path.write_text(text)
    load_config(str(path))


def test_the_committed_config_reference_is_the_generated_one() -> None:
    """docs/config.md is what `hvd-train config --reference` prints from the schema."""
    committed = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert (
        committed == reference()
    ), "docs/config.md is stale: run `hvd-train config --reference > docs/config.md`"


def test_the_committed_config_schema_is_the_generated_one() -> None:
    """docs/config.schema.json is what `hvd-train config --schema` prints from the schema."""
    committed = (ROOT / "docs" / "config.schema.json").read_text(encoding="utf-8")
    assert (
        committed == schema_text()
    ), "docs/config.schema.json is stale: run `hvd-train config --schema > docs/config.schema.json`"


def test_the_reference_names_every_key_with_its_meaning() -> None:
    """Every key of the schema has a row in the reference, and every row says what it means."""
    from hvd_train.config import Config, to_dict

    rows = re.findall(r"^\| `([\w.\[\]]+)` \|.*\| ([^|]*) \|$", reference(), re.M)
    documented = {key: meaning.strip() for key, meaning in rows}
    keys = {f"{s}.{k}" for s, section in to_dict(Config()).items() if isinstance(section, dict) for k in section}  # fmt: skip
    assert keys <= set(documented), sorted(keys - set(documented))
    assert {"callbacks", "callbacks[i].class", "callbacks[i].args"} <= set(documented)
    assert [k for k, meaning in documented.items() if not meaning] == []


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        yield base if n == 0 else f"{base}-{n}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_the_pages_leads_somewhere(page) -> None:
    """Each relative link of a page names a file that exists and, for a page, a heading in it."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in set(anchors(file))):  # fmt: skip
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize(
    "page", [p for p in PAGES if not is_record(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_dates_and_commits_stay_in_the_records(page) -> None:
    """Outside docs/benchmarks.md, docs/validation.md and lab/ no page holds a date or a commit hash:
    a page says what the code does, the records say when what was measured."""
    prose = re.sub(r"\]\([^)]*\)", "]", FENCE.sub("", page.read_text(encoding="utf-8")))
    found = re.findall(r"\b20\d\d-\d\d-\d\d\b", prose)
    found += [h for h in re.findall(r"\b[0-9a-f]{7,12}\b", prose) if re.search(r"\d", h) and re.search(r"[a-f]", h)]  # fmt: skip
    found += re.findall(r"\b(?:measured|tried|found) here\b", prose, re.I)
    assert found == [], f"{page.relative_to(ROOT)}: {found}"


def test_the_readme_is_read_in_minutes() -> None:
    """The README stays a pitch, a quick start, a tour and links: at most 300 lines."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move reference material to docs/"


def test_the_readme_console_is_what_make_demo_runs() -> None:
    """The README's console of `make demo` shows the command and the last line the Makefile's
    demo recipe has today."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    launch, echo = (line.strip() for line in recipe.splitlines())
    console = next(text for where, text in fenced("text") if where.startswith("README.md"))
    assert launch.replace("$(VENV)", ".venv").replace("$(NP)", "2") in console
    assert echo.removeprefix('@echo "').removesuffix('"') in console


DOCKERFILE = ROOT / "Dockerfile"
CUDA_IMAGE = re.compile(r"nvidia/cuda:[\w.-]+")


def dockerfile_header_runs() -> list[tuple[str, list[str]]]:
    """The `docker run` commands the Dockerfile's comments show, as words."""
    lines = [line.lstrip("# ") for line in DOCKERFILE.read_text().splitlines()]
    return [
        (f"Dockerfile:{i + 1}", shlex.split(line[line.index("docker run") :]))
        for i, line in enumerate(lines)
        if "docker run" in line
    ]


def test_gpu_containers_get_the_shared_memory_nccl_needs() -> None:
    """Every `docker run --gpus` the docs and the Dockerfile show gives the container
    `--ipc=host` or `--shm-size`: NCCL and the shared-memory all-reduce keep their buffers in
    /dev/shm, of which Docker gives 64 MB (issue 60: docs/docker.md ran the GPU image with
    `--gpus all` alone)."""
    runs = [(w, words) for w, words in SHOWN if words[:2] == ["docker", "run"]]
    runs += dockerfile_header_runs()
    on_gpus = [(w, words) for w, words in runs if any(x.startswith("--gpus") for x in words)]
    assert on_gpus, "no `docker run --gpus` shown"
    for where, words in on_gpus:
        assert any(
            x == "--ipc=host" or x.startswith("--shm-size") for x in words
        ), f"{where}: {shlex.join(words)} runs on GPUs with Docker's 64 MB /dev/shm"


def test_the_docs_name_the_dockerfiles_own_cuda_base() -> None:
    """The docs name only CUDA images the Dockerfile names, name its default BASE_IMAGE, and
    name that one wherever they call an image the default (issue 60: docs/docker.md called
    nvidia/cuda:12.2.2 the GPU image's default base, where the Dockerfile's is 12.5.1's)."""
    text = DOCKERFILE.read_text()
    default = re.search(r"^ARG BUILD_FROM=\$\{BASE_IMAGE:-(\S+)\}$", text, re.M).group(1)
    named = set(CUDA_IMAGE.findall(text))
    for page in PAGES:
        if is_record(page):  # they keep what was true when each run was made
            continue
        body = page.read_text(encoding="utf-8")
        for image in CUDA_IMAGE.findall(body):
            assert image in named, f"{page.name}: {image} is not a base the Dockerfile names"
        for sentence in re.split(r"(?<=[.;!?])\s+", " ".join(body.split())):
            images = CUDA_IMAGE.findall(sentence)
            if "default" in sentence and images:
                assert (
                    default in images
                ), f"{page.name}: the default named is not {default}: {sentence}"
    assert f"BASE_IMAGE={default}" in (ROOT / "docs" / "docker.md").read_text()
