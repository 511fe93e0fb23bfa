"""infer_output_shapes: explicit shape rules where an op has one, the kernel otherwise."""

import numpy as np
import pytest

from kiln import ops
from kiln.ir import Model
from kiln.schema import DType, Padding


def _op(op_type, inputs, options=None):
    sg = Model().add_subgraph("main")
    tensors = []
    for k, x in enumerate(inputs):
        if isinstance(x, tuple):  # an activation of this shape
            tensors.append(sg.add_tensor(f"x{k}", DType.FLOAT32, x))
        else:
            tensors.append(sg.add_constant(f"c{k}", x))
    out = sg.add_tensor("y", DType.FLOAT32, ())
    return sg.add_operator(op_type, tensors, [out], options=options or {})


@pytest.mark.parametrize("op_type, inputs, options, expected", [
    ("CONV_2D", [(1, 9, 9, 3), np.zeros((4, 3, 3, 3), np.float32)],
     {"padding": Padding.VALID, "stride_w": 2, "stride_h": 2}, [(1, 4, 4, 4)]),
    ("FULLY_CONNECTED", [(2, 3, 8), np.zeros((5, 8), np.float32)], {"keep_num_dims": True}, [(2, 3, 5)]),
    ("RESHAPE", [(2, 3, 4), np.array([4, -1], np.int32)], {}, [(4, 6)]),
    ("TRANSPOSE", [(2, 3, 4), np.array([2, 0, 1], np.int32)], {}, [(4, 2, 3)]),
    ("MEAN", [(2, 3, 4), np.array([1], np.int32)], {"keep_dims": True}, [(2, 1, 4)]),
])
def test_infer_output_shapes(op_type, inputs, options, expected):
    assert ops.infer_output_shapes(_op(op_type, inputs, options)) == expected
