"""The Interpreter API's edges: resolver tables, keyword arguments, errors raised inside nodes."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import kiln
from tests.harness import feed
from tests.runtime.conftest import litert
from tests.runtime.test_custom_ops import ScaleShift, custom_model

X = np.array([-2.0, -0.5, 0.25, 3.0], np.float32)


# -- builtin and custom ops are separate tables -----------------------------------------------

def test_a_custom_op_named_like_a_builtin_leaves_the_builtin_resolvable():
    """add_custom("ADD") registers the custom op "ADD"; the model's builtin ADD still runs."""
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("ADD", ScaleShift().registration())
    data = custom_model("ADD", {"scale": 2.0, "shift": 1.0})  # CUSTOM "ADD", then builtin ADD
    (z,) = feed(kiln.Interpreter(model_content=data, op_resolver=resolver), [X])
    np.testing.assert_array_equal(z, 2 * (X * 2.0 + 1.0))
    assert resolver.find_op("ADD").kernel is not None            # the builtin kernel
    assert resolver.find_custom("ADD").invoke is not None         # the Python op
    assert resolver.registered_custom_versions("ADD") == [(1, 1)]


def test_a_custom_op_named_like_a_builtin_does_not_run_the_builtin_kernel():
    """Without a custom "ADD", a CUSTOM op of that name is unresolved, as in LiteRT."""
    data = custom_model("ADD", None)
    with pytest.raises(kiln.RegistrationError, match="Didn't find custom operator for name 'ADD'"):
        kiln.Interpreter(model_content=data).allocate_tensors()
    with pytest.raises(RuntimeError, match="Encountered unresolved custom op: ADD"):
        litert(data).allocate_tensors()


# -- keyword arguments ------------------------------------------------------------------------

def test_unknown_keyword_argument_is_refused_by_name():
    data = custom_model("ScaleShift", None)
    with pytest.raises(TypeError, match="num_thread"):
        kiln.Interpreter(model_content=data, num_thread=4)
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    with pytest.raises(TypeError, match="num_thread"):
        LiteRT(model_content=data, num_thread=4)


def test_every_litert_keyword_argument_is_accepted():
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    theirs = [n for n in inspect.signature(LiteRT.__init__).parameters if n != "self"]
    ours = inspect.signature(kiln.Interpreter.__init__).parameters
    assert [n for n in theirs if n not in ours] == []
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("ScaleShift", ScaleShift().registration())
    defaults = {n: p.default for n, p in inspect.signature(LiteRT.__init__).parameters.items()
                if n in theirs[2:]}
    interp = kiln.Interpreter(model_content=custom_model("ScaleShift", {"scale": 1.0}), op_resolver=resolver,
                              custom_op_registerers=[], **defaults)
    (z,) = feed(interp, [X])
    np.testing.assert_array_equal(z, 2 * X)
