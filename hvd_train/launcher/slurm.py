"""Inside a Slurm allocation: the hosts and the workers on each, from Slurm's variables.

`hvd-train launch --slurm` turns the allocation into horovodrun's `-H host:slots,...`:

- hosts: `SLURM_JOB_NODELIST`, in Slurm's compressed form (`node[01-03,07],gpu-a`);
- workers per host: one per GPU, `SLURM_GPUS_ON_NODE` (`--gpus-per-node`), on a GPU
  allocation, also over a smaller `--ntasks-per-node` (`gpus_note` says so), and more tasks a
  node than GPUs are refused; else `SLURM_NTASKS_PER_NODE` when the job asked for it
  (`--ntasks-per-node`), else `SLURM_TASKS_PER_NODE` (`2(x3),1`: what Slurm laid out, one a
  node by default).

Standard library only: read by the launcher before anything starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hvd_train.base.errors import UserError

_BRACKET = re.compile(r"^([^\[\]]*)\[([^\[\]]+)\](.*)$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class SlurmError(UserError):
    """Not inside an allocation, or a variable Slurm would not write (exit code 2)."""


def hosts(env: Mapping[str, str]) -> list[tuple[str, int]]:
    """(host, workers) of each node of the allocation, in Slurm's order.

    Raises:
        SlurmError: no allocation (SLURM_JOB_NODELIST unset), or a malformed variable.
    """
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not listed:
        raise SlurmError(
            "--slurm: SLURM_JOB_NODELIST is not set: run it inside an allocation (sbatch, "
            "salloc), or give --hosts"
        )
    nodes = expand_nodelist(listed)
    per_node = gpus_a_node(env)
    if per_node is None and env.get("SLURM_NTASKS_PER_NODE"):
        per_node = _positive("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS_PER_NODE"])
    if per_node is not None:
        return [(node, per_node) for node in nodes]
    counts = expand_counts("SLURM_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE") or "1")
    if len(counts) == 1:
        counts *= len(nodes)
    if len(counts) != len(nodes):
        raise SlurmError(
            f"--slurm: SLURM_TASKS_PER_NODE gives {len(counts)} nodes, SLURM_JOB_NODELIST "
            f"{len(nodes)}"
        )
    return list(zip(nodes, counts, strict=True))


def gpus_a_node(env: Mapping[str, str]) -> int | None:
    """Workers a node on a GPU allocation: one per GPU (`SLURM_GPUS_ON_NODE`); None without GPUs.

    Raises:
        SlurmError: more tasks a node (`--ntasks-per-node`) than GPUs: two workers would
            share a GPU, which NCCL refuses.
    """
    if env.get("SLURM_GPUS_ON_NODE", "0") in ("", "0"):  # no GPUs asked for
        return None
    gpus = _positive("SLURM_GPUS_ON_NODE", env["SLURM_GPUS_ON_NODE"])
    tasks = env.get("SLURM_NTASKS_PER_NODE")
    if tasks and _positive("SLURM_NTASKS_PER_NODE", tasks) > gpus:
        raise SlurmError(
            f"--slurm: {tasks} tasks a node (SLURM_NTASKS_PER_NODE) but {gpus} GPUs a node "
            f"(SLURM_GPUS_ON_NODE): one worker per GPU, never two on one; submit with "
            f"--ntasks-per-node={gpus} or fewer, or with more GPUs a node"
        )
    return gpus


def gpus_note(env: Mapping[str, str]) -> str | None:
    """One line when the GPUs a node win over a smaller `--ntasks-per-node`, else None."""
    gpus, tasks = gpus_a_node(env), env.get("SLURM_NTASKS_PER_NODE")
    if gpus is None or not tasks or int(tasks) >= gpus:
        return None
    return (
        f"--slurm: {gpus} GPUs a node (SLURM_GPUS_ON_NODE) and {tasks} task(s) a node "
        f"(SLURM_NTASKS_PER_NODE): one worker per GPU, {gpus} a node (--np for fewer)"
    )


def horovodrun_hosts(allocation: list[tuple[str, int]]) -> str:
    """horovodrun's `-H`: `host:slots,...`."""
    return ",".join(f"{host}:{slots}" for host, slots in allocation)


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list as names: `node[01-03,07],gpu-a` gives node01, node02,
    node03, node07, gpu-a (numbers keep the width of the range's start).

    Raises:
        SlurmError: unbalanced or nested brackets, a bad range.
    """
    names = [name for item in _split_top_level(text) for name in _expand(item, text)]
    if not names:
        raise SlurmError(f"--slurm: SLURM_JOB_NODELIST names no host: {text!r}")
    return names


def expand_counts(key: str, text: str) -> list[int]:
    """Slurm's compressed counts: `2(x3),1` gives [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        m = _COUNT.match(item.strip())
        if not m or int(m.group(1)) < 1:
            raise SlurmError(f"--slurm: {key}={text!r}: expected counts like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _positive(key: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise SlurmError(f"--slurm: {key}={text!r}: expected a whole number of workers >= 1")
    return int(text)


def _split_top_level(text: str) -> list[str]:
    """Splits at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth not in (0, 1):
            raise SlurmError(f"--slurm: SLURM_JOB_NODELIST={text!r}: unbalanced brackets")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise SlurmError(f"--slurm: SLURM_JOB_NODELIST={text!r}: unbalanced brackets")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand(item: str, whole: str) -> list[str]:
    """One top-level item: each bracket a set of alternatives (a product when several)."""
    m = _BRACKET.match(item)
    if m is None:
        if "[" in item or "]" in item:  # an empty bracket
            raise SlurmError(f"--slurm: SLURM_JOB_NODELIST={whole!r}: bad brackets in {item!r}")
        return [item]
    prefix, alternatives, rest = m.groups()
    tails = _expand(rest, whole)
    return [prefix + value + tail for value in _values(alternatives, whole) for tail in tails]


def _values(alternatives: str, whole: str) -> list[str]:
    values = []
    for part in alternatives.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise SlurmError(f"--slurm: SLURM_JOB_NODELIST={whole!r}: bad range {part!r}")
        values += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi or lo) + 1)]
    return values
