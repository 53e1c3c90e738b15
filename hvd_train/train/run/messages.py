"""An exception as the one line a rank says about it (its failure line, a resume's refusal)."""

from __future__ import annotations

import tensorflow as tf

from hvd_train.base.errors import UserError


def one_line(e: BaseException) -> str:
    """The exception's message on one line; for a TensorFlow op error its last real line
    (its message also holds a Python traceback of where the op was defined)."""
    text = str(e)
    if isinstance(e, tf.errors.OpError):
        lines = [ln.strip() for ln in e.message.splitlines() if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith("[[")] or lines
        text = lines[-1] if lines else text
    text = " ".join(text.split()) or type(e).__name__
    return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"
