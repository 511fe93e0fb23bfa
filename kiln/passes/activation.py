"""Activation fusion: RELU / RELU6 / RELU_N1_TO_1 after an op with a fused_activation_function
option becomes that option — also through reshapes (an activation commutes with them).

Only when the host's output has no other reader: fusing into a host whose raw output is
also read would take a second copy of the host, and a rewrite never adds arithmetic (a
copied 1×1 convolution per NASNet cell made a model 1.37× the multiply-adds of TF's).

CONCATENATION is no host: LiteRT's kernel rejects any fused activation. TANH is not fused: LiteRT's float kernels apply a fused activation as a clamp
(CalculateActivationRange), which has no TANH, so a fused TANH would be silently ignored.
"""

from __future__ import annotations

from .. import ops
from ..ir import Operator, Subgraph
from ..schema import Activation, DType
from .manager import OperatorPass
from .rewrite import bypass, sole_user, writes_variable

FUSABLE_ACTIVATIONS = {
    "RELU": Activation.RELU, "RELU6": Activation.RELU6, "RELU_N1_TO_1": Activation.RELU_N1_TO_1,
}
#: Ops whose LiteRT float kernels apply fused_activation_function (their records say so).
HOSTS = frozenset(name for name, record in ops.OPS.items() if record.fused_activation_host)


_RESHAPES = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")


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
    return (host is not None and host.op_type in HOSTS and not host.options["fused_activation_function"]
            and out.dtype == DType.FLOAT32 and not writes_variable(host)
            and (out.quantization is None or out.quantization.is_empty))


def _fuse(sg: Subgraph, act: Operator) -> bool:
    kind = FUSABLE_ACTIVATIONS.get(act.op_type)
    if kind is None or writes_variable(act):
        return False
    x = act.inputs[0]
    if sole_user(x) is not act:
        return False   # the raw output is read too: keep the standalone activation
    host, out = _host_of(x)
    if not _fusable(host, out) or (out is not x and sole_user(out) is None):
        return False
    host.options["fused_activation_function"] = int(kind)
    if not bypass(sg, act, x):
        host.options["fused_activation_function"] = 0
        return False
    return True


class FuseActivations(OperatorPass):
    name = "fuse-activations"

    def rewrite(self, sg, op) -> bool:
        return _fuse(sg, op)
