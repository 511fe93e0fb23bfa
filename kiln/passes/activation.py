"""Activation fusion: RELU / RELU6 / RELU_N1_TO_1 after an op with a fused_activation_function
option becomes that option.

CONCATENATION is no host: LiteRT's kernel rejects any fused activation. TANH is not fused: LiteRT's float kernels apply a fused activation as a clamp
(CalculateActivationRange), which has no TANH, so a fused TANH would be silently ignored.
"""

from __future__ import annotations

from ..ir import Model, Operator, Subgraph
from ..schema import Activation, DType
from .manager import Pass
from .rewrite import bypass, sole_user, writes_variable

FUSABLE_ACTIVATIONS = {
    "RELU": Activation.RELU, "RELU6": Activation.RELU6, "RELU_N1_TO_1": Activation.RELU_N1_TO_1,
}
#: Ops whose LiteRT float kernels apply fused_activation_function.
HOSTS = frozenset({
    "ADD", "SUB", "MUL", "DIV", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
})


def _fuse(sg: Subgraph, act: Operator) -> bool:
    kind = FUSABLE_ACTIVATIONS.get(act.op_type)
    if kind is None:
        return False
    x = act.inputs[0]
    host = x.producer
    if host is None or host.op_type not in HOSTS or sole_user(x) is not act:
        return False
    if host.options.get("fused_activation_function", 0) or x.dtype != DType.FLOAT32 or writes_variable(act):
        return False
    if x.quantization is not None and not x.quantization.is_empty:
        return False
    host.options["fused_activation_function"] = int(kind)
    if not bypass(sg, act, x):
        host.options["fused_activation_function"] = 0
        return False
    return True


class FuseActivations(Pass):
    name = "fuse-activations"

    def run(self, model: Model) -> bool:
        changed = False
        for sg in model.subgraphs:
            for op in list(sg.operators):
                if op.subgraph is sg:
                    changed |= _fuse(sg, op)
        return changed
