"""Where a run begins: rank 0 tidies run.dir and reads the newest checkpoint that loads (or the
one `train.resume` names); weights, optimizer state and position then reach every rank by
broadcast, so other hosts need not see rank 0's disk."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from hvd_train.base.errors import CheckpointError, DataError, UserError
from hvd_train.config import Config
from hvd_train.data.job import Job
from hvd_train.record.layout import RunDir
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.runtime.keras.contract import Model
from hvd_train.runtime.schedules import continue_at, lr_multiplier
from hvd_train.train.callbacks import random_states
from hvd_train.train.checkpoint import (
    PREFIX,
    STATE_FILE,
    CheckpointState,
    CheckpointStore,
    OtherKeras,
    Unloadable,
    load,
    read_window,
    remove_strays,
    set_aside_earlier_run,
)
from hvd_train.train.run.messages import one_line
from hvd_train.train.run.state import Start


class Found(NamedTuple):
    """Rank 0's checkpoint to resume from, as every rank receives it."""

    path: str
    state: CheckpointState
    set_aside: list[str]  # the newer checkpoints that could not be loaded, renamed out of the way
    window: list[list[np.ndarray]] | None = None  # each rank's part-way accumulation sums


def resume(job: Job, model: Model) -> Start:
    """Rank 0 tidies run.dir, then picks and reads the checkpoint; weights, optimizer state and
    position are then broadcast, so other hosts need not see rank 0's disk. Every rank raises
    alike on error: DataError (exit 2) for a checkpoint that cannot be resumed from."""
    cfg, plan = job.cfg, job.plan
    # The optimizer's slots exist on every rank (step.build_compiled_model built them) before
    # the restore and the broadcast fill them.
    found: Found | None = None
    error: Exception | None = None
    if distributed.is_chief():
        try:
            removed = remove_strays(cfg.run.dir)  # this job owns run.dir now
            if removed:
                distributed.log(
                    f"removed what a killed job left half-written: {', '.join(removed)}"
                )
            if cfg.train.resume == "never" and (aside := set_aside_earlier_run(cfg.run.dir)):
                distributed.log(
                    f"train.resume: never: what an earlier run left here (its checkpoints, its "
                    f"best model) is set aside in {aside}, out of this run's way"
                )
            found = _read_checkpoint(cfg, model)
            if found:
                found = found._replace(window=read_window(found.path))
        except (UserError, CheckpointError) as e:
            error = e
        except OSError as e:
            error = DataError(one_line(e))
    found, error = distributed.broadcast_object((found, error), name="resume_point")
    if error is not None:
        raise error
    # Horovod: every rank starts from rank 0's replicated state, restored or not: weights,
    # optimizer state, the accumulation window's position, the loss scale (runtime/replicas.py).
    binding.active().broadcast_model(model)
    # Then each rank its own dropout stream: the checkpoint's, or a fresh one; and its own
    # sums of a part-way accumulation window.
    saved = found.state.get("random_states") if found else None
    random_states.start(model, saved, plan.world_size)
    random_states.start_window(model, found.window if found else None, plan.world_size)
    if not found:
        return Start()
    state = found.state
    # ReduceLROnPlateau's factor so far (state.json, broadcast above), on every rank.
    multiplier = lr_multiplier(model.optimizer)
    if multiplier is not None:
        multiplier.assign(state.get("lr_multiplier", 1.0))
    epoch, step = state["epoch"], state["step"]
    if step and state["global_batch"] != plan.global_batch:
        # The epoch's order does not depend on the worker count: continue after the examples
        # already seen, rounded down to a whole global batch (a few may be seen twice).
        step = state["examples_in_epoch"] // plan.global_batch
    if step >= plan.steps_per_epoch:
        epoch, step = epoch + 1, 0
    # The schedule lives in epochs: at another worker count or batch size the restored step
    # counter means other epochs, so the schedule continues from the epoch resumed at.
    continue_at(model.optimizer, epoch + step / plan.steps_per_epoch)
    aside = ", ".join(found.set_aside)
    aside = f"; set aside as unloadable: {aside}" if aside else ""
    distributed.log(
        f"resuming from {found.path}: epoch {epoch + 1}, step {step} "
        f"(saved with {state['world_size']} worker(s), global batch {state['global_batch']})"
        f"{aside}"
    )
    return Start(epoch=epoch, step=step, checkpoint=found.path, metrics=state.get("metrics", {}))


def _read_checkpoint(cfg: Config, model: Model) -> Found | None:
    """Rank 0: None to start afresh, or the restored checkpoint's path and state, and the newer
    checkpoints that could not be loaded, renamed out of the way (`set_aside`).

    With `train.resume: auto`, a checkpoint that cannot be loaded (truncated, corrupt, not
    matching the model) is named in one warning and the next older one is tried. When none
    loads, this fails rather than start afresh: a fresh run would write over metrics.csv and
    prune the very checkpoints the user may want to repair or resume with the right config.
    """
    resume = cfg.train.resume
    if resume == "never":
        return None
    if resume != "auto":
        return Found(resume, _load_named(RunDir(cfg.run.dir), model, resume), [])
    store = CheckpointStore(cfg.run.dir, cfg.checkpoint)
    failed: list[tuple[str, Unloadable]] = []
    candidates = store.named()[::-1]  # newest first
    for i, path in enumerate(candidates):
        try:
            state = load(model, path)
        except OtherKeras as e:
            raise DataError(
                f"train.resume: auto: cannot resume from {path}: {e}, or start afresh with "
                "another run.dir or train.resume=never"
            ) from None
        except Unloadable as e:
            failed.append((path, e))
            then = "trying the next older one" if i + 1 < len(candidates) else "no older one"
            distributed.log(f"warning: cannot resume from {path}: {e}; {then}")
            continue
        aside = [store.set_aside(p) for p, _ in failed]
        return Found(path, state, aside)
    if not failed:
        return None
    newest, why = failed[0]
    raise DataError(
        f"train.resume: auto: none of the {len(failed)} checkpoint(s) in {store.dir} can be "
        f"loaded (the newest, {newest}: {why}); resume from a good copy with "
        "train.resume=PATH, or start afresh with another run.dir or train.resume=never"
    )


def _load_named(run: RunDir, model: Model, path: str) -> CheckpointState:
    """`train.resume: PATH`: its state, restored into `model`; a one-line DataError if not."""
    if not any(os.path.exists(os.path.join(path, f)) for f in (STATE_FILE, f"{PREFIX}.index")):
        raise DataError(
            f"train.resume: {path} is not a checkpoint folder (expected {STATE_FILE} and "
            f"{PREFIX}.index in it, as in {run.checkpoint_pattern})"
        )
    try:
        return load(model, path)
    except OtherKeras as e:
        raise DataError(f"train.resume: cannot resume from {path}: {e}") from None
    except Unloadable as e:
        fix = (
            "use train.resume=never or another run.dir"
            if e.mismatch
            else "name another checkpoint, or use train.resume=auto for the newest that loads"
        )
        raise DataError(f"train.resume: cannot resume from {path}: {e}; {fix}") from None
