"""The objects a Python custom op sees: context, node and tensors.

They mirror LiteRT's TfLiteContext / TfLiteNode / TfLiteTensor closely enough that the
custom-operator guide reads the same in Python: ``prepare`` checks the inputs and sizes the
outputs with ``context.resize_tensor``; ``invoke`` writes ``node.outputs[i].data``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..errors import OpError


class TensorView:
    """One tensor as a custom op sees it; ``data`` is a NumPy array (writable for outputs).

    An output's buffer is made (zero-filled) when the op first reads ``data``: an op that
    assigns a new array to ``data`` never pays for one.
    """

    __slots__ = ("_env", "index", "name", "dtype", "quantization", "_ir", "_output")

    def __init__(self, env, index: int, ir_tensor, output: bool = False):
        self._env = env
        self.index = index
        self._ir = ir_tensor
        self.name = ir_tensor.name
        self.dtype = ir_tensor.dtype.numpy
        self.quantization = ir_tensor.quantization
        self._output = output

    @property
    def data(self) -> np.ndarray:
        value = self._env.values[self.index]
        if value is None:
            if not self._output:
                raise OpError(f"tensor {self.name!r} has no data yet")
            value = self._env.values[self.index] = np.zeros(self._env.shapes[self.index], dtype=self.dtype)
        return value

    @data.setter
    def data(self, value) -> None:
        self._env.values[self.index] = np.asarray(value, dtype=self.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        value = self._env.values[self.index]
        return tuple(value.shape) if value is not None else self._env.shapes[self.index]

    def __repr__(self) -> str:
        return f"<TensorView {self.name!r} {np.dtype(self.dtype).name} {list(self.shape)}>"


class Node:
    """One operator instance: its input/output tensors, options and the op's user data."""

    __slots__ = ("inputs", "outputs", "user_data", "builtin_options", "custom_options", "index", "op_name")

    def __init__(self, inputs, outputs, builtin_options, custom_options, index, op_name):
        self.inputs = inputs
        self.outputs = outputs
        self.user_data = None
        self.builtin_options = builtin_options
        self.custom_options = custom_options
        self.index = index
        self.op_name = op_name


class Context:
    """What prepare/invoke may ask of the interpreter."""

    def __init__(self, env):
        self._env = env

    def resize_tensor(self, tensor: TensorView, shape) -> None:
        """Give ``tensor`` a fresh zero-filled buffer of ``shape`` (as TfLiteContext::ResizeTensor)."""
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise OpError(f"cannot resize tensor {tensor.name!r} to {list(shape)}: negative dimension")
        self._env.check_allocation(tensor.index, shape, tensor.dtype)
        self._env.shapes[tensor.index] = shape
        self._env.values[tensor.index] = np.zeros(shape, dtype=tensor.dtype)

    def report_error(self, message: str) -> None:
        raise OpError(message)

    @property
    def num_threads(self) -> int:
        return self._env.num_threads


def decode_builtin_options(op) -> SimpleNamespace:
    from .. import ops

    record = ops.get(op.op_type)
    if record is not None:
        return record.make_options(op.options)
    return SimpleNamespace(**op.options)
