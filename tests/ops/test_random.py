"""Random ops against LiteRT: RANDOM_UNIFORM, RANDOM_STANDARD_NORMAL, MULTINOMIAL.

A seeded node draws LiteRT's numbers (TF's Philox stream: uniform and multinomial bit for
bit, normal to float rounding), invoke after invoke; unseeded nodes differ between
interpreters, and the draws have the distribution they claim."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.errors import OpError
from tests.harness import Const, single_op_model
from tests.ops.test_shape import check_both_fail

REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}


def i32(values) -> np.ndarray:
    return np.asarray(values, np.int32)


def invokes(model: bytes, n: int = 3, litert: bool = False, **kwargs) -> list[np.ndarray]:
    """Outputs of ``n`` invokes of one interpreter (inputs are all constants)."""
    if litert:
        from ai_edge_litert.interpreter import Interpreter
        interp = Interpreter(model_content=model)
    else:
        interp = kiln.Interpreter(model_content=model, **kwargs)
    interp.allocate_tensors()
    out = []
    for _ in range(n):
        interp.invoke()
        out.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    return out


def draw_model(op: str, shape, seed=0, seed2=0) -> bytes:
    return single_op_model(op, [Const(i32(shape))], options={"seed": seed, "seed2": seed2})


def multinomial_model(logits, n, seed=0, seed2=0, dtype=np.int64) -> bytes:
    logits = np.asarray(logits, np.float32)
    return single_op_model("MULTINOMIAL", [Const(logits), Const(np.int32(n))], options={"seed": seed, "seed2": seed2},
                           out_dtypes=[dtype], out_shapes=[(logits.shape[0], n)])


@pytest.mark.parametrize("op", ["RANDOM_UNIFORM", "RANDOM_STANDARD_NORMAL"])
@pytest.mark.parametrize("shape", [[7], [2, 3], [0], [1, 1, 5]])
@pytest.mark.parametrize("seeds", [(3, 5), (0, 9), (87654321, 1), (-2, 0)])
def test_seeded_draws_are_litert_s(op, shape, seeds):
    model = draw_model(op, shape, *seeds)
    expected = invokes(model, litert=True)
    tol = 0 if op == "RANDOM_UNIFORM" else 1e-6  # sin / cos / log rounding of NumPy vs libm
    for kwargs in (REF, {}):  # kiln's kernel, and the default Interpreter (LiteRT's kernel)
        got = invokes(model, **kwargs)
        for a, e in zip(got, expected):
            assert a.shape == e.shape == tuple(shape) and a.dtype == np.float32
            np.testing.assert_allclose(a, e, rtol=0, atol=tol)
    if expected[0].size:
        assert not np.array_equal(expected[0], expected[1]), "two invokes must differ"


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("seeds", [(2, 0), (0, 7), (87654321, 2)])
def test_seeded_multinomial_is_litert_s(dtype, seeds):
    logits = np.array([[-2.3, -1.6, -0.36, -np.inf], [0, 0, 0, 0], [-np.inf, -np.inf, np.nan, -np.inf]], np.float32)
    model = multinomial_model(logits, 9, *seeds, dtype=dtype)
    expected = invokes(model, litert=True)
    for kwargs in (REF, {}):
        for a, e in zip(invokes(model, **kwargs), expected):
            assert a.dtype == dtype
            np.testing.assert_array_equal(a, e)


def ks_statistic(sample: np.ndarray, cdf) -> float:
    s = np.sort(sample.astype(np.float64))
    f = cdf(s)
    n = s.size
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def normal_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("kwargs", [REF, {}], ids=["reference", "default"])
def test_unseeded_draws_have_their_distribution(kwargs):
    n = 20000
    bound = 1.95 / math.sqrt(n)  # the KS test's 0.1 % critical value
    uniform = np.concatenate(invokes(draw_model("RANDOM_UNIFORM", [n]), 2, **kwargs))
    assert uniform.min() >= 0 and uniform.max() < 1
    assert ks_statistic(uniform, lambda s: s) < bound
    normal = np.concatenate(invokes(draw_model("RANDOM_STANDARD_NORMAL", [n]), 2, **kwargs))
    assert abs(normal.mean()) < 0.03 and abs(normal.var() - 1) < 0.03
    assert ks_statistic(normal, normal_cdf) < bound
    # categorical draws: frequencies follow softmax(logits); non-finite logits are never drawn
    logits = np.array([[0.0, np.log(3), -np.inf, np.nan, np.log(6)]], np.float32)
    draws = np.concatenate(invokes(multinomial_model(logits, n), 2, **kwargs), axis=1)
    freq = np.bincount(draws.ravel(), minlength=5) / draws.size
    np.testing.assert_allclose(freq, [0.1, 0.3, 0, 0, 0.6], atol=0.01)


def test_unseeded_interpreters_differ_and_seeded_ones_repeat():
    unseeded, seeded = draw_model("RANDOM_UNIFORM", [8]), draw_model("RANDOM_UNIFORM", [8], 1, 2)
    for kwargs in (REF, {}):
        assert not np.array_equal(invokes(unseeded, 1, **kwargs)[0], invokes(unseeded, 1, **kwargs)[0])
        np.testing.assert_array_equal(invokes(seeded, 2, **kwargs)[1], invokes(seeded, 2, **kwargs)[1])


def test_multinomial_edges_as_litert():
    """Zero samples; a row without a finite logit draws the class count, as LiteRT does."""
    for logits, n in (([[0.0, 1.0]], 0), ([[-np.inf, np.nan, np.inf]], 4)):
        model = multinomial_model(logits, n, 5, 6)
        for a, e in zip(invokes(model, 2, **REF), invokes(model, 2, litert=True)):
            np.testing.assert_array_equal(a, e)


def test_refusals():
    check_both_fail("RANDOM_UNIFORM", [Const(i32([-1, 2]))], out_dtypes=[np.float32], out_shapes=[(1, 2)])
    check_both_fail("MULTINOMIAL", [Const(np.zeros((2, 0), np.float32)), Const(np.int32(3))],
                    out_dtypes=[np.int64], out_shapes=[(2, 3)])
    with pytest.raises(OpError, match="output type"):
        invokes(single_op_model("RANDOM_UNIFORM", [Const(i32([2]))], out_dtypes=[np.int32], out_shapes=[(2,)]),
                1, **REF)


def test_random_ops_are_never_folded_or_merged():
    from kiln import ops

    assert all(ops.get(n).stateful and not ops.is_pure(n)
               for n in ("RANDOM_UNIFORM", "RANDOM_STANDARD_NORMAL", "MULTINOMIAL"))
