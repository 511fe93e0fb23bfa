"""The LiteRT custom-operator guide's Sin example, end to end in Python.

LiteRT runs a custom operator only after it is written in C++ and linked into the runtime;
from Python a model holding one cannot run at all. kiln runs it with a Python kernel that
follows the same contract: ``init / free / prepare / invoke`` registered in an op resolver.

Why float64: TensorFlow 2.21 has a builtin SIN for float32, so the guide's float32 ``tf.sin``
now converts to that builtin. LiteRT's SIN has no float64 kernel, so for float64 TensorFlow's
converter (with ``allow_custom_ops=True``) emits exactly what the guide describes: a custom
operator named "Sin" — with the TensorFlow attributes ({"T": FLOAT64}) as FlexBuffer custom
options, which ``init`` reads here.

Run: python examples/custom_sin.py   (needs TensorFlow for the conversion step)
"""

from __future__ import annotations

import numpy as np
from flatbuffers import flexbuffers

import kiln
from kiln.schema import DType


def convert_sin_model() -> bytes:
    """y = sin(x) for a float64 vector of any length, converted by TensorFlow's converter."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.float64)])
    def sin(x):
        return tf.sin(x, name="Sin")

    converter = tf.lite.TFLiteConverter.from_concrete_functions([sin.get_concrete_function()], sin)
    converter.allow_custom_ops = True
    return converter.convert()


# -- the kernel: the guide's SinPrepare / SinEval, in Python ---------------------------------

def sin_init(context, buffer: bytes):
    """Parse the op's attributes once; what init returns comes back as ``node.user_data``."""
    attrs = flexbuffers.Loads(buffer) if buffer else {}
    expected = attrs.get("T", int(DType.FLOAT64))
    return {"dtype": DType(expected).numpy}


def sin_prepare(context, node):
    """One input, one output of the same type; the output takes the input's shape."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        context.report_error(f"Sin takes 1 input and 1 output, got {len(node.inputs)} and {len(node.outputs)}")
    (x,), (y,) = node.inputs, node.outputs
    if np.dtype(x.dtype) != node.user_data["dtype"] or np.dtype(y.dtype) != np.dtype(x.dtype):
        context.report_error(f"Sin: expected {node.user_data['dtype']} tensors, got {x.dtype} -> {y.dtype}")
    context.resize_tensor(y, x.shape)


def sin_invoke(context, node):
    np.sin(node.inputs[0].data, out=node.outputs[0].data)


SIN = kiln.Registration(init=sin_init, prepare=sin_prepare, invoke=sin_invoke)


def make_interpreter(model: bytes) -> kiln.Interpreter:
    """An interpreter with every builtin plus the Python Sin."""
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("Sin", SIN)
    return kiln.Interpreter(model_content=model, op_resolver=resolver)


def main() -> None:
    import tensorflow as tf

    model = convert_sin_model()
    ops = [(op.name, op.version) for op in kiln.read_model(model).main.operators]
    print("operators in the converted model:", ops)

    try:  # without the registration, kiln says what LiteRT's guide says
        kiln.Interpreter(model_content=model).allocate_tensors()
    except kiln.RegistrationError as exc:
        print("without a kernel:", str(exc).splitlines()[0], "...", str(exc).splitlines()[-1])

    x = np.linspace(-np.pi, np.pi, 9)
    interp = make_interpreter(model)
    interp.resize_tensor_input(0, x.shape)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    y = interp.get_tensor(interp.get_output_details()[0]["index"])
    expected = tf.sin(x).numpy()
    print("kiln  :", np.round(y, 6))
    print("tf.sin:", np.round(expected, 6))
    print("max |difference|:", float(np.max(np.abs(y - expected))))


if __name__ == "__main__":
    main()
