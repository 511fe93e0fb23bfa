"""The UNIDIRECTIONAL_SEQUENCE_LSTM record's integer kernel: LiteRT's 8x8->16 full-integer
LSTM (kiln.quant.integer_lstm), adapted to the kernel contract — like the float kernel, it
returns the output, then the new output and cell states (``state_operands``)."""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..quant import integer_lstm
from .record import INT8, KernelCall, with_state


def _uni_lstm_int8(call: KernelCall, *inputs):
    op, opts = call.op, call.opts
    integer_lstm.check_operands(op, inputs)
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{integer_lstm.NAME}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} "
                      f"and {opts.proj_clip}")
    p = integer_lstm.prepare(op, inputs, cell_clip=float(opts.cell_clip), proj_clip=float(opts.proj_clip))
    out, h, c = integer_lstm.run(p, np.asarray(inputs[0]), np.asarray(inputs[integer_lstm.OUTPUT_STATE]),
                                 np.asarray(inputs[integer_lstm.CELL_STATE]), bool(opts.time_major))
    return with_state(call, [out], (h, c))


UNIDIRECTIONAL_SEQUENCE_LSTM = {INT8: _uni_lstm_int8}
