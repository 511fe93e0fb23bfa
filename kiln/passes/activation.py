"""Activation fusion: RELU / RELU6 / RELU_N1_TO_1 after an op with a fused_activation_function
option becomes that option — also through reshapes (an activation commutes with them), and
for a fully-connected / conv output with other readers by a copy of the op that fuses it.

CONCATENATION is no host: LiteRT's kernel rejects any fused activation. TANH is not fused: LiteRT's float kernels apply a fused activation as a clamp
(CalculateActivationRange), which has no TANH, so a fused TANH would be silently ignored.
"""

from __future__ import annotations

from ..ir import Operator, Subgraph
from ..schema import Activation, DType
from .manager import OperatorPass
from .rewrite import add_tensor_like, bypass, sole_user, writes_variable

FUSABLE_ACTIVATIONS = {
    "RELU": Activation.RELU, "RELU6": Activation.RELU6, "RELU_N1_TO_1": Activation.RELU_N1_TO_1,
}
#: Ops whose LiteRT float kernels apply fused_activation_function.
HOSTS = frozenset({
    "ADD", "SUB", "MUL", "DIV", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
})


_RESHAPES = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")
#: Hosts worth duplicating when their output has other readers too (as TF's converter does:
#: the weights are shared, the RELU disappears).
_CLONABLE = frozenset({"FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"})


def _host_of(x):
    """(host op, its output) feeding ``x`` directly or through sole-use reshapes."""
    t = x
    while t.producer is not None and t.producer.op_type in _RESHAPES:
        src = t.producer.inputs[0]
        if sole_user(src) is not t.producer:
            break
        t = src
    return t.producer, t


def _fusable(host, out) -> bool:
    return (host is not None and host.op_type in HOSTS and not host.options.get("fused_activation_function", 0)
            and out.dtype == DType.FLOAT32 and not writes_variable(host)
            and (out.quantization is None or out.quantization.is_empty))


def _fuse(sg: Subgraph, act: Operator) -> bool:
    kind = FUSABLE_ACTIVATIONS.get(act.op_type)
    if kind is None or writes_variable(act):
        return False
    x = act.inputs[0]
    if sole_user(x) is act:
        host, out = _host_of(x)
        if not _fusable(host, out) or (out is not x and sole_user(out) is None):
            return False
        host.options["fused_activation_function"] = int(kind)
        if not bypass(sg, act, x):
            host.options["fused_activation_function"] = 0
            return False
        return True
    host = x.producer
    if not _fusable(host, x) or host.op_type not in _CLONABLE or len(host.outputs) != 1:
        return False
    # x has other readers: compute a copy of the host with the activation fused.
    clone = sg.add_operator(host.op_type, list(host.inputs), [add_tensor_like(sg, act.outputs[0].name, x)],
                            index=sg.operators.index(act), options=dict(host.options))
    clone.options["fused_activation_function"] = int(kind)
    clone.version = host.version
    return bypass(sg, act, clone.outputs[0])


class FuseActivations(OperatorPass):
    name = "fuse-activations"

    def rewrite(self, sg, op) -> bool:
        return _fuse(sg, op)
