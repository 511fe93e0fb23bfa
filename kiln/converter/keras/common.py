"""What the Keras 3 LSTM loop modules share: the mismatch signal, the roles of the
recognised loop's variables, and small helpers that look through a TensorFlow graph."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...fusion.lstm import LstmWeights
from ...schema import Activation
from ..tfutil import tf

UNI_OP = "UNIDIRECTIONAL_SEQUENCE_LSTM"
BIDI_OP = "BIDIRECTIONAL_SEQUENCE_LSTM"


class Mismatch(Exception):
    """The loop is not what this module fuses; the message says why."""


def strip(t):
    """``t`` seen through Identity ops."""
    while t.op.type in ("Identity", "IdentityN"):
        t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
    return t


def same(a, b) -> bool:
    return a.name == b.name and a.graph is b.graph


def const_value(t) -> np.ndarray | None:
    t = strip(t)
    if t.op.type != "Const":
        return None
    return np.asarray(tf().make_ndarray(t.op.get_attr("value")))


def int_const(t) -> int | None:
    v = const_value(t)
    return None if v is None or v.size != 1 else int(v.reshape(()))


def placeholder_index(fg, t) -> int | None:
    t = strip(t)
    for i, p in enumerate(fg.inputs):
        if same(p, t):
            return i
    return None


@dataclass
class LstmLoop:
    """Roles of the While's loop variables and the recognised cell."""

    n: int
    passthrough: set[int]
    counters: list[int]          # step counters (start 0, +1), the TF loop counter included
    time: int                    # the counter the list is read with
    in_list: int
    out_list: int
    h: int
    c: int
    all_steps: bool              # SetItem at the step (return_sequences) or at 0
    activation: Activation
    weights: LstmWeights
