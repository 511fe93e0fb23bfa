"""Issue #21's one-op conformance sweep: every op kiln's quantizer can make integer, quantized by
kiln and run by kiln and by LiteRT.

For each float one-op model of tests/quant/one_op_models.py (every op whose record has a
quantization trait, several option variants each) and each mode — ``int8`` and ``int16x8``
always, ``dynamic`` where the trait says LiteRT has a hybrid kernel — kiln.quantize makes the
model, and:

- `test_ops_are_quantized_as_their_traits_say`: every op of the result is integer where its
  record's trait says LiteRT runs it with the mode's activation type (``quantized_in``), hybrid
  (int8 weights, float activations) in ``dynamic``, and float otherwise — so an op whose trait
  excludes int16 stays float in 16x8. An op the quantizer replaces is listed in `REWRITTEN`.
- `test_kiln_equals_litert_reference`: kiln's Interpreter (default resolver, and BUILTIN_REF)
  and LiteRT's BUILTIN_REF kernels on the same held-out inputs: integer outputs bit for bit,
  float outputs within `FLOAT_ULPS` float32 ulps of the largest output magnitude;
  `test_float_interface_equals_litert_reference`: the same on kiln.quantize's default
  float-I/O models (QUANTIZE / DEQUANTIZE at the edges).
- `test_ops_kept_float_in_16x8_have_no_int16_kernel_in_litert`: a trait that excludes int16 is
  right — LiteRT refuses the op's int8 model made int16.
- `test_versions_load_and_min_runtime_version`: LiteRT's resolver registers every op at the
  version kiln wrote, and ``min_runtime_version`` is the largest of the ops' runtime versions
  (the records' runtime_version.cc rows, compared as integers).
- `test_versions_equal_tf_exporter` (slow): TensorFlow 2.21's flatbuffer exporter, which
  re-derives every op version with LiteRT's op_version.cc and the model's minimum with
  runtime_version.cc, gives the same versions when it round-trips the model
  (tests/quant/tf_op_versions.py) — wherever the round trip keeps each op's operand types and
  options; where it changes them it is no oracle and the case says what changed.
- `test_xla_delegate_claims_or_says_why` (slow; needs JAX): kiln.XlaDelegate claims each node or
  its ``rejected`` map gives the reason; what it claims computes LiteRT's outputs.

`test_every_quantizable_op_has_models_or_a_reason` keeps the sweep whole: an op that gains a
trait without a builder fails it. Fast: about 5 s alone on 2 cores; the slow lane (TF's
exporter in a subprocess, XLA compiles) adds about 35 s.

Integer modes quantize with ``integer_only`` and integer model inputs and outputs, so the
compared outputs are the op's own integer results; a mode that keeps the op float quantizes
with float fallback and float I/O. Everything kiln gets wrong is a strict xfail in `FINDINGS`
(one table, each entry the precise finding), so a fix flips the test.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.schema import DType
from tests.quant.one_op_models import NOT_STANDALONE, OneOpModel, by_name, one_op_models, quantized_ops, unbuilt_ops

MODES = ("int8", "int16x8", "dynamic")
SCHEME = {"int8": "int8", "int16x8": "int16"}
ACTIVATION = {"int8": DType.INT8, "int16": DType.INT16}
#: Float outputs (ops kept float, hybrid ops, dequantized outputs) may differ by this many
#: float32 ulps of the largest output magnitude: the kernels order float sums and call libm
#: differently (measured: at most 1 ulp — ELU, LOG_SOFTMAX, L2_NORMALIZATION kept float in
#: 16x8; hybrid FULLY_CONNECTED / convolutions equal bit for bit).
FLOAT_ULPS = {"int8": 4, "int16x8": 4, "dynamic": 4}

#: Ops the quantizer replaces in a mode (the op is absent from the result; the ops that replace
#: it are checked against their own traits).
REWRITTEN = {
    ("BIDIRECTIONAL_SEQUENCE_LSTM", "int8"): "LiteRT has no integer bidirectional LSTM: kiln writes two integer "
                                             "UNIDIRECTIONAL_SEQUENCE_LSTMs and a REVERSE_V2",
    ("BIDIRECTIONAL_SEQUENCE_LSTM", "int16x8"): "as in int8; the LSTMs run int8 between QUANTIZEs",
}

#: (op, version) that LiteRT's BUILTIN_REF resolver does not register but its builtin kernels
#: (BUILTIN_WITHOUT_DEFAULT_DELEGATES) run: models holding them are compared with those.
NOT_IN_BUILTIN_REF = {
    ("ELU", 1): "BUILTIN_REF registers no ELU at all",
    ("TILE", 3): "BUILTIN_REF registers TILE versions 1-2 (int8 TILE is version 3)",
    ("DEPTH_TO_SPACE", 2): "BUILTIN_REF registers DEPTH_TO_SPACE version 1 only (int8 is version 2)",
}


_FC_16X8_VERSION = ("deliberate: kiln writes a 16x8 FULLY_CONNECTED (int16 input, int8 weights, no bias) as version 1 "
                    "(min_runtime_version 1.5.0); LiteRT's op_version.cc, as TF 2.21's exporter runs it, gives 11 "
                    "(2.15.0): ParseFullyConnected turns quantized_bias_type FLOAT32 (0 in the file) into "
                    "kTfLiteFloat32 (1), so its 'quantized_bias_type set' test holds for every int16 x int8 node. kiln follows the rule's "
                    "intent (no quantized_bias_type, no bump): 16x8 FULLY_CONNECTED ran long before LiteRT 2.15")


#: (check, model name, mode) -> the finding that makes the check fail today (strict xfail).
FINDINGS: dict[tuple[str, str, str], str] = {
    ("tf_versions", "FULLY_CONNECTED-no_bias", "int16x8"): _FC_16X8_VERSION,
}


# -- the cases ------------------------------------------------------------------------------------

def modes_of(model: OneOpModel) -> tuple[str, ...]:
    return MODES if ops.require(model.op).quantization.hybrid else MODES[:2]


def integer(op_name: str, mode: str) -> bool:
    """Whether the trait makes ``op_name`` integer in ``mode``."""
    q = ops.require(op_name).quantization
    return mode in SCHEME and q is not None and q.quantized_in(SCHEME[mode])


#: The per-case checks (FINDINGS' first key).
CHECKS = ("quantized", "runs", "runs_float_io", "loads", "tf_versions", "xla", "int16_refused")


def _cases(check: str, integer_only: bool = False):
    assert check in CHECKS
    for model in one_op_models():
        for mode in modes_of(model):
            if integer_only and not integer(model.op, mode):
                continue
            finding = FINDINGS.get((check, model.name, mode))
            marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
            yield pytest.param(model.name, mode, id=f"{model.name}-{mode}", marks=marks)


@functools.lru_cache(maxsize=None)
def quantized(name: str, mode: str, float_io: bool = False) -> bytes:
    """kiln.quantize's model for (model, mode): integer I/O and integer-only where the trait makes
    the op integer, float I/O with float fallback where it keeps the op float (and with
    ``float_io``: kiln.quantize's defaults)."""
    model = by_name()[name]
    options: dict = {"progress": False}
    if mode != "dynamic":
        options["representative_dataset"] = model.representative_dataset()
        if integer(model.op, mode) and not float_io:
            io = SCHEME[mode]
            options.update(integer_only=True, inference_input_type=io, inference_output_type=io)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few calibration samples, on purpose
        return kiln.quantize(model.float_model, mode, **options)


def feeds(name: str, mode: str, float_io: bool = False) -> list[list[np.ndarray]]:
    """The held-out inputs, quantized with the model inputs' parameters where those are integer."""
    model = kiln.read_model(quantized(name, mode, float_io))
    out = []
    for sample in by_name()[name].held_out():
        row = []
        for t, x in zip(model.main.inputs, sample):
            if t.dtype != DType.FLOAT32:
                q, info = t.quantization, np.iinfo(t.dtype.numpy)
                x = np.clip(np.round(x / q.scale[0]) + q.zero_point[0], info.min, info.max).astype(t.dtype.numpy)
            row.append(x)
        out.append(row)
    return out


#: (op, version) whose BUILTIN_REF kernel is wrong, so the builtin (optimized) kernel is the oracle.
BUILTIN_REF_WRONG = {
    ("SUM", 2): "LiteRT's reference int8 SUM reads the codes as uint8; kiln's kernel is its optimized one",
}
#: Ops kept float in 16x8 although LiteRT has an int16 kernel, and why.
INT16_KEPT_FLOAT = {
    "SUM": "TF's 16x8 quantizer keeps SUM float, and LiteRT's int16 reference SUM is wrong (thousands of codes off)",
}


def litert_resolver(model_bytes: bytes):
    """BUILTIN_REF, or the builtin kernels where the model holds an op BUILTIN_REF lacks or
    computes wrongly."""
    from ai_edge_litert.interpreter import OpResolverType

    held = {(op.op_type, op.version) for op in kiln.read_model(model_bytes).main.operators}
    return OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if held & (set(NOT_IN_BUILTIN_REF) | set(BUILTIN_REF_WRONG)) \
        else OpResolverType.BUILTIN_REF


def invoke(interp, rows) -> list[list[np.ndarray]]:
    interp.allocate_tensors()
    results = []
    for row in rows:
        for d, x in zip(interp.get_input_details(), row):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        results.append([interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()])
    return results


@functools.lru_cache(maxsize=None)
def litert_outputs(name: str, mode: str, float_io: bool = False) -> list[list[np.ndarray]]:
    """LiteRT's outputs on the held-out inputs (one interpreter per model)."""
    from ai_edge_litert.interpreter import Interpreter

    model = quantized(name, mode, float_io)
    return invoke(Interpreter(model_content=model, experimental_op_resolver_type=litert_resolver(model)),
                  feeds(name, mode, float_io))


def assert_same_outputs(got, want, mode: str, what: str) -> None:
    """Integer outputs bit for bit; float ones within FLOAT_ULPS ulps of the largest magnitude."""
    for r, (g_row, w_row) in enumerate(zip(got, want)):
        assert len(g_row) == len(w_row), what
        for k, (g, w) in enumerate(zip(g_row, w_row)):
            where = f"{what}, input {r}, output {k}"
            assert g.dtype == w.dtype and g.shape == w.shape, f"{where}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
            if np.issubdtype(w.dtype, np.floating):
                scale = float(np.abs(w).max()) if w.size else 0.0
                atol = FLOAT_ULPS[mode] * float(np.finfo(np.float32).eps) * max(scale, np.finfo(np.float32).tiny)
                np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=where)
            else:
                np.testing.assert_array_equal(g, w, err_msg=where)


# -- the sweep covers every quantizable op --------------------------------------------------------

def test_every_quantizable_op_has_models_or_a_reason():
    assert not unbuilt_ops(), f"ops with a quantization trait but no one-op builder: {unbuilt_ops()}"
    built = {m.op for m in one_op_models()}
    assert not built & set(NOT_STANDALONE), "an op is both built and declared unbuildable"
    assert built | set(NOT_STANDALONE) == set(quantized_ops())
    assert len(one_op_models()) >= 60
    assert len({m.name for m in one_op_models()}) == len(one_op_models()), "model names must be unique"


def test_every_finding_names_a_case():
    """A finding for a case the sweep no longer makes would silently stop being checked."""
    made = {(check, model.name, mode) for check in CHECKS for model in one_op_models() for mode in modes_of(model)
            if check != "runs_float_io" or integer(model.op, mode)}
    made |= {("int16_refused", op, "int16x8") for op in _int8_only_ops()}
    assert set(FINDINGS) <= made, sorted(set(FINDINGS) - made)


def test_weights_are_large_enough_for_dynamic_range():
    """Every weighted op's constant weights have at least 1024 elements, so ``dynamic`` takes them."""
    from tests.harness import Const

    for model in one_op_models():
        record = ops.require(model.op)
        if record.weights is None:
            continue
        for i in record.weights.operands:
            if i < len(model.operands) and isinstance(model.operands[i], Const):
                assert model.operands[i].value.size >= 1024, (model.name, i)


def test_not_in_builtin_ref_is_still_true():
    """Each `NOT_IN_BUILTIN_REF` entry: BUILTIN_REF refuses a model holding it, the builtin kernels
    load it (drop the entry when LiteRT registers it)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    seen = set()
    for model in one_op_models():
        for mode in modes_of(model):
            held = {(op.op_type, op.version) for op in kiln.read_model(quantized(model.name, mode)).main.operators}
            for entry in held & set(NOT_IN_BUILTIN_REF) - seen:
                seen.add(entry)
                content = quantized(model.name, mode)
                with pytest.raises(ValueError, match=f"'{entry[0]}' version '{entry[1]}'"):
                    Interpreter(model_content=content, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
                Interpreter(model_content=content,
                            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                            ).allocate_tensors()
    assert seen == set(NOT_IN_BUILTIN_REF), f"entries no model reaches: {set(NOT_IN_BUILTIN_REF) - seen}"


def _int8_only_ops() -> list[str]:
    """Ops the quantizer makes int8 but keeps float in 16x8 (their traits exclude int16)."""
    return sorted({m.op for m in one_op_models() if integer(m.op, "int8") and not integer(m.op, "int16x8")}
                  - set(INT16_KEPT_FLOAT))


def _as_int16(content: bytes) -> bytes:
    """An integer-I/O int8 model with every int8 activation made int16 (zero point 0, scale / 256),
    each op at the version kiln's rule gives it."""
    from kiln.format import write_model
    from kiln.ir import QuantParams

    model = kiln.read_model(content)
    for t in model.main.tensors:
        if t.dtype == DType.INT8 and not t.is_constant:
            q = t.quantization
            t.dtype = DType.INT16
            t.quantization = QuantParams(np.asarray(q.scale, np.float32) / 256, np.zeros_like(q.zero_point))
    for op in model.main.operators:
        op.version = ops.require(op.op_type).version(op)
    return write_model(model)


@pytest.mark.parametrize("op_name", [
    pytest.param(op, marks=[pytest.mark.xfail(strict=True, reason=FINDINGS["int16_refused", op, "int16x8"])]
                 if ("int16_refused", op, "int16x8") in FINDINGS else []) for op in _int8_only_ops()])
def test_ops_kept_float_in_16x8_have_no_int16_kernel_in_litert(op_name):
    """A trait that excludes int16 is right only if LiteRT cannot run the op with int16
    activations: neither BUILTIN_REF nor the builtin kernels take the op's int8 model made int16."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    model = next(m for m in one_op_models() if m.op == op_name)
    content = _as_int16(quantized(model.name, "int8"))
    rows = [[np.zeros(d.shape, np.int16) for d in kiln.read_model(content).main.inputs]]
    for resolver in (OpResolverType.BUILTIN_REF, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
        with pytest.raises((RuntimeError, ValueError)):
            invoke(Interpreter(model_content=content, experimental_op_resolver_type=resolver), rows)


# -- per (model, mode) ----------------------------------------------------------------------------

def _kind(op, record) -> str:
    """'integer', 'hybrid' or 'float': what the node's real-valued tensors are."""
    real = [t for t in list(op.inputs) + list(op.outputs) if t is not None and t.dtype != DType.INT32
            and t.dtype != DType.INT64 and t.dtype != DType.BOOL]
    dtypes = {t.dtype for t in real}
    if DType.FLOAT32 not in dtypes:
        return "integer"
    if dtypes == {DType.FLOAT32}:
        return "float"
    w = record.weights
    if w is not None and all(op.inputs[i] is None or op.inputs[i].dtype == DType.INT8
                             for i in w.operands if i < len(op.inputs)) \
            and op.inputs[w.input].dtype == DType.FLOAT32 and all(t.dtype == DType.FLOAT32 for t in op.outputs):
        return "hybrid"
    return f"mixed {sorted(d.name for d in dtypes)}"


@pytest.mark.parametrize("name,mode", list(_cases("quantized")))
def test_ops_are_quantized_as_their_traits_say(name, mode):
    model = by_name()[name]
    result = kiln.read_model(quantized(name, mode)).main
    types = [op.op_type for op in result.operators]
    if (model.op, mode) in REWRITTEN:
        assert model.op not in types, f"{REWRITTEN[model.op, mode]}, yet {model.op} is still there: {types}"
    else:
        assert types.count(model.op) == 1, f"{model.op} expected once in {types}"
    for index, op in enumerate(result.operators):
        if op.op_type in ("QUANTIZE", "DEQUANTIZE"):
            continue
        record = ops.require(op.op_type)
        if mode == "dynamic":
            want = "hybrid" if op.op_type == model.op and record.quantization.hybrid else "float"
        else:
            want = "integer" if integer(op.op_type, mode) else "float"
        got = _kind(op, record)
        assert got == want, f"node {index} {op.op_type} in {mode}: {got}, its trait says {want}"
        if want == "integer":
            scheme = SCHEME[mode]
            if scheme not in record.quantization.types:   # a fused LSTM: int8 kernel in 16x8 models
                scheme = "int8"
            assert op.outputs[0].dtype == ACTIVATION[scheme], (index, op.op_type, op.outputs[0].dtype)


@pytest.mark.parametrize("name,mode", list(_cases("runs")))
def test_kiln_equals_litert_reference(name, mode):
    want = litert_outputs(name, mode)
    content = quantized(name, mode)
    for label, resolver in (("kiln default", None), ("kiln BUILTIN_REF", kiln.OpResolverType.BUILTIN_REF)):
        got = invoke(kiln.Interpreter(model_content=content, experimental_op_resolver_type=resolver),
                     feeds(name, mode))
        assert_same_outputs(got, want, mode, f"{name} {mode}: {label} vs LiteRT {litert_resolver(content).name}")


@pytest.mark.parametrize("name,mode", list(_cases("runs_float_io", integer_only=True)))
def test_float_interface_equals_litert_reference(name, mode):
    """The same with kiln.quantize's default float inputs and outputs (QUANTIZE / DEQUANTIZE at
    the edges), as `kiln quantize` writes models: kiln's default Interpreter equals LiteRT."""
    content = quantized(name, mode, True)
    assert all(t.dtype == DType.FLOAT32 for t in kiln.read_model(content).main.inputs)
    got = invoke(kiln.Interpreter(model_content=content), feeds(name, mode, True))
    assert_same_outputs(got, litert_outputs(name, mode, True), mode, f"{name} {mode} float I/O")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


@pytest.mark.parametrize("name,mode", list(_cases("loads")))
def test_versions_load_and_min_runtime_version(name, mode):
    from ai_edge_litert.interpreter import Interpreter

    content = quantized(name, mode)
    Interpreter(model_content=content, experimental_op_resolver_type=litert_resolver(content)).allocate_tensors()
    model = kiln.read_model(content)
    listed = [ops.require(op.op_type).runtime_version(op.version) for op in model.main.operators]
    want = max((v for v in listed if v), key=_version_key, default="")
    raw = model.metadata.get("min_runtime_version")
    assert raw is not None, "a quantized model states its min_runtime_version"
    assert raw.rstrip(b"\0").decode() == want and len(raw) == 16, (raw, want)


# -- slow: TensorFlow's exporter as the op_version.cc oracle ---------------------------------------

@pytest.fixture(scope="module")
def tf_versions(tmp_path_factory):
    """TF's round trip of every quantized model (tests/quant/tf_op_versions.py), keyed by case id."""
    pytest.importorskip("tensorflow")
    from tests.quant.tf_op_versions import tf_round_trips

    models = {f"{m.name}-{mode}": quantized(m.name, mode) for m in one_op_models() for mode in modes_of(m)}
    return tf_round_trips(models, tmp_path_factory.mktemp("tf_op_versions"))


def _signature(op) -> tuple:
    """What op_version.cc reads of a node: operand and result types, and its options."""
    return (op.op_type, tuple(None if t is None else t.dtype.name for t in op.inputs),
            tuple(t.dtype.name for t in op.outputs), tuple(sorted((k, repr(v)) for k, v in op.options.items())))


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", list(_cases("tf_versions")))
def test_versions_equal_tf_exporter(name, mode, tf_versions):
    """Each operator code's version (TF's exporter writes one per code: the largest of its
    nodes') and min_runtime_version equal what TF 2.21 derives for the same nodes."""
    theirs = tf_versions[f"{name}-{mode}"]
    if isinstance(theirs, str):
        pytest.skip(f"no oracle: {theirs[:300]}")
    ours, tf_model = kiln.read_model(quantized(name, mode)), kiln.read_model(theirs)
    for a, b in zip(ours.main.operators, tf_model.main.operators):
        if _signature(a) != _signature(b):
            changed = [(x, y) for x, y in zip(_signature(a), _signature(b)) if x != y]
            pytest.skip(f"no oracle: TF's round trip changes {a.op_type}: {changed}"[:400])
    assert len(ours.main.operators) == len(tf_model.main.operators)
    versions: dict[str, set] = {}
    for op in ours.main.operators:
        versions.setdefault(op.op_type, set()).add(op.version)
    tf_versions_by_code = {}
    for op in tf_model.main.operators:
        tf_versions_by_code.setdefault(op.op_type, set()).add(op.version)
    mismatched = {code: (max(v), tf_versions_by_code[code]) for code, v in versions.items()
                  if {max(v)} != tf_versions_by_code[code]}
    assert not mismatched, f"op code: (kiln's version, TF's): {mismatched}"
    def runtime(model):
        return model.metadata.get("min_runtime_version", b"").rstrip(b"\0").decode()
    assert runtime(ours) == runtime(tf_model)


# -- slow: the XLA delegate ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,mode", list(_cases("xla")))
def test_xla_delegate_claims_or_says_why(name, mode):
    """kiln.XlaDelegate claims each node or says why not; with what it claims, the model computes
    LiteRT's outputs (the rest runs on kiln's reference kernels)."""
    pytest.importorskip("jax")
    content = quantized(name, mode)
    delegate = kiln.XlaDelegate()
    interp = kiln.Interpreter(model_content=content, experimental_delegates=[delegate],
                              experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()   # nodes are offered to the delegate here
    nodes = kiln.read_model(content).main.operators
    seen = {index for index, _, _ in delegate.claimed} | {key[0] for key in delegate.rejected}
    assert seen == set(range(len(nodes))), f"nodes neither claimed nor refused: {set(range(len(nodes))) - seen}"
    for key, reason in delegate.rejected.items():
        assert isinstance(reason, str) and reason.strip(), f"node {key} refused without a reason"
    if not delegate.claimed:
        return
    assert_same_outputs(invoke(interp, feeds(name, mode)), litert_outputs(name, mode), mode,
                        f"{name} {mode}: XlaDelegate (claimed {[c[1] for c in delegate.claimed]}) vs LiteRT")
