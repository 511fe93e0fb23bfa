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
from ..rules import Decline, Rule
from ..schema import Activation, DType
from .manager import RulePass
from .rewrite import bypass, describe, sole_user, writes_variable


def _fused_form(op_type: str) -> Activation | None:
    """The fused_activation_function that stands for activation op ``op_type`` (its record's)."""
    record = ops.get(op_type)
    return None if record is None else record.fuses_as


#: Ops whose LiteRT float kernels apply fused_activation_function (their records say so).
HOSTS = frozenset(name for name, record in ops.OPS.items() if record.fused_activation_host)


def _host_of(x):
    """(host op, its output) feeding ``x`` directly or through sole-use reshapes."""
    t = x
    while t.producer is not None and ops.states(t.producer.op_type, "reshapes"):
        src = t.producer.inputs[0]
        if sole_user(src) is not t.producer:
            break
        t = src
    return t.producer, t


def _match(site):
    sg, act = site
    if _fused_form(act.op_type) is None or writes_variable(act):
        return None
    return sg, act


def _refusal(site) -> str | None:
    """Why the activation cannot become its producer's fused_activation_function."""
    _, act = site
    x = act.inputs[0]
    if sole_user(x) is not act:
        return "its input is also read elsewhere (fusing would copy the producer)"
    host, out = _host_of(x)
    if host is None:
        return "its input is not computed by an op"
    if host.op_type not in HOSTS:
        return f"its producer {host.op_type} applies no fused activation in LiteRT"
    if host.options["fused_activation_function"]:
        return f"its producer {describe(host)} already applies a fused activation"
    if out.dtype != DType.FLOAT32 or (out.quantization is not None and not out.quantization.is_empty):
        return f"its producer's output is {out.dtype.name}, not float32"
    if writes_variable(host):
        return f"its producer {describe(host)} writes a variable"
    if out is not x and sole_user(out) is None:
        return "the producer's output is read elsewhere before the reshape"
    return None


def _rewrite(site) -> bool:
    sg, act = site
    x = act.inputs[0]
    host, _ = _host_of(x)
    host.options["fused_activation_function"] = int(_fused_form(act.op_type))
    if not bypass(sg, act, x):
        host.options["fused_activation_function"] = 0
        raise Decline("its input and output are both subgraph outputs (LiteRT cannot alias them)")
    return True


FUSE_ACTIVATION = Rule(
    "fuse-activation", "pass", _match, _rewrite, check=_refusal,
    subject=lambda site: describe(site[1]),
    detail=lambda site: f"{describe(site[1])}: folded into its producer as a fused activation")


class FuseActivations(RulePass):
    name = "fuse-activations"
    rules = (FUSE_ACTIVATION,)
