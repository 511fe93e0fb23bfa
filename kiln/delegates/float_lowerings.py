"""Float-chain lowerings of the sequence LSTM, slicing, reversing, transposing, batched
matmul and softmax.

Each checks its node once per input shape (by running the reference kernel on zeros, or on
the constants it depends on) and then does, per invoke, only the reference kernel's
arithmetic, in the same order, so the outputs are the kernel's bit for bit. The LSTM's
constant weights are read and packed once; its new states go back through the partition's
``state_inputs`` (kiln.runtime.delegate). kiln/delegates/delegate.py registers them.
"""

from __future__ import annotations

import numpy as np

from ..ops.activations import softmax
from ..ops.indexing import strided_slice_plan
from ..ops.lstm import pack_gates, read_operands, uni_lstm_run
from ..ops.shape import transpose_perm, dense, int_values, norm_axis
from ..schema import UNIDIRECTIONAL_LSTM
from .compiled import F32, Node, probe

#: The sequence LSTM's weight operands: constants the chain packs once.
LSTM_WEIGHTS = tuple(UNIDIRECTIONAL_LSTM.weights)


def _owned(a: np.ndarray) -> np.ndarray:
    """`dense`, but never a view: for outputs that leave the partition, which may alias a
    buffer the chain reuses on the next invoke."""
    return a.copy() if not a.flags.owndata or not a.flags.c_contiguous else a


def lower_uni_lstm(node: Node):
    """UNIDIRECTIONAL_SEQUENCE_LSTM with constant weights: checked and packed once."""
    call = node.call
    (out, *_) = probe(node)  # every check the kernel makes, for these shapes
    probe_inputs = [c if c is not None else (None if s is None else np.zeros(s, F32))
                    for s, c in zip(node.in_shapes, node.consts)]
    p = read_operands("UNIDIRECTIONAL_SEQUENCE_LSTM", probe_inputs, UNIDIRECTIONAL_LSTM,
                   diagonal=bool(node.opts.diagonal_recurrent_tensors))
    packed = pack_gates(p)
    pairs = list(zip(node.in_slots, node.consts))
    oi = node.out_slots[0]
    state_slots = [node.in_slots[UNIDIRECTIONAL_LSTM.output_state], node.in_slots[UNIDIRECTIONAL_LSTM.cell_state]]

    def run(slots):
        args = [c if c is not None else (slots[s] if s >= 0 else None) for s, c in pairs]
        y, *states = uni_lstm_run(np, call, args, p, packed)
        slots[oi] = y
        for s, value in zip(state_slots, states):
            if s >= 0:
                slots[s] = value

    return run, [out.shape]


def _unary(node: Node, probed: np.ndarray, compute):
    """A one-input node computing ``compute(x, own)`` per invoke (``own``: `_owned` if the output
    leaves the partition, else `dense`); ``probed``: the reference kernel's output on zeros."""
    xi, oi, own = node.in_slots[0], node.out_slots[0], _owned if node.fresh[0] else dense

    def run(slots):
        slots[oi] = compute(slots[xi], own)

    return run, [probed.shape]


def lower_strided_slice(node: Node):
    """STRIDED_SLICE with constant begin / end / strides: the view worked out once."""
    (probed,) = probe(node)  # the kernel's checks first
    eff_shape, index, out_shape = strided_slice_plan(node.opts, np.zeros(node.in_shapes[0], F32), *node.consts[1:4])
    index = tuple(index)
    return _unary(node, probed, lambda x, own: own(x.reshape(eff_shape)[index]).reshape(out_shape))


def lower_reverse(node: Node):
    """REVERSE_V2 over constant axes."""
    (probed,) = probe(node)  # the kernel's checks first
    rank = len(node.in_shapes[0])
    axes = tuple(sorted({norm_axis(a, rank, "REVERSE_V2") for a in int_values(node.consts[1], "REVERSE_V2", "axis")}))
    return _unary(node, probed, lambda x, own: own(np.flip(x, axes)) if axes else x.copy())


def lower_transpose(node: Node):
    """TRANSPOSE by a constant permutation."""
    (probed,) = probe(node)  # the kernel's checks first
    perm = transpose_perm(np.zeros(node.in_shapes[0], F32), node.consts[1])
    return _unary(node, probed, lambda x, own: own(np.transpose(x, perm)))


def lower_softmax(node: Node):
    """SOFTMAX: the kernel's float64 evaluation, without its per-call checks."""
    (probed,) = probe(node)
    call = node.call
    return _unary(node, probed, lambda x, own: softmax(np, call, x))
