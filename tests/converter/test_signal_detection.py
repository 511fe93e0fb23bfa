"""Signal and detection ops: ``tf.signal``'s RFFT family and ``tf.image``'s non-max suppression
convert to the builtins TF 2.21's converter writes, at its versions, and LiteRT and kiln (default
and BUILTIN_REF resolvers) compute what TensorFlow computes, special values included. The slow
lane adds TF's converter itself, an audio front end and an SSD-style detector, each from Keras
and from a SavedModel.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import tempfile

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.errors import ConversionError, KilnError  # noqa: E402
from tests.converter import zoo  # noqa: E402


def _cases(tf):
    """name -> (function, input specs)."""
    S, f32 = tf.TensorSpec, tf.float32
    boxes = [S([None, 4], f32), S([None], f32)]

    def mel():
        return tf.signal.linear_to_mel_weight_matrix(8, 33, 16000, 20.0, 4000.0)

    def v4(b, s):
        return tuple(tf.raw_ops.NonMaxSuppressionV4(boxes=b, scores=s, max_output_size=6, iou_threshold=0.5,
                                                    score_threshold=0.2, pad_to_max_output_size=True))

    def v5(b, s):
        return tuple(tf.raw_ops.NonMaxSuppressionV5(boxes=b, scores=s, max_output_size=6, iou_threshold=0.5,
                                                    score_threshold=0.1, soft_nms_sigma=0.3,
                                                    pad_to_max_output_size=True))

    return {
        "rfft_abs": (lambda x: tf.abs(tf.signal.rfft(x)), [S([4, 16], f32)]),
        "rfft_pad_imag": (lambda x: tf.math.imag(tf.signal.rfft(x, [16])), [S([3, 12], f32)]),
        "rfft_crop_real": (lambda x: tf.math.real(tf.signal.rfft(x, [8])), [S([3, 12], f32)]),
        "rfft2d_real": (lambda x: tf.math.real(tf.signal.rfft2d(x)), [S([2, 8, 16], f32)]),
        "rfft2d_imag": (lambda x: tf.math.imag(tf.signal.rfft2d(x, [4, 16])), [S([8, 8], f32)]),
        "rfft_dynamic": (lambda x: tf.abs(tf.signal.rfft(x)), [S([None, None, 8], f32)]),
        "rfft_length_input": (lambda x, n: tf.abs(tf.signal.rfft(x, n)), [S([2, 8], f32), S([1], tf.int32)]),
        "complex_mul": (lambda x: tf.math.real(tf.signal.rfft(x) * tf.complex(1.0, -2.0))
                        + tf.math.imag(tf.square(tf.signal.rfft(x))), [S([2, 8], f32)]),
        "complex_cast": (lambda x: tf.cast(tf.signal.rfft(x), f32) + tf.abs(tf.cast(x[:, :5], tf.complex64)),
                         [S([2, 8], f32)]),
        "stft": (lambda x: tf.abs(tf.signal.stft(x, 16, 8)), [S([2, 64], f32)]),
        "log_mel": (lambda x: tf.math.log(tf.matmul(tf.abs(tf.signal.stft(x, 64, 32)), mel()) + 1e-6),
                    [S([1, 256], f32)]),
        "nms_v3": (lambda b, s: tf.image.non_max_suppression(b, s, 6, 0.5, score_threshold=0.2), boxes),
        "nms_v3_default": (lambda b, s: tf.image.non_max_suppression(b, s, 6), boxes),
        "nms_v4_padded": (v4, boxes),
        "nms_v5_hard": (lambda b, s: tf.image.non_max_suppression_with_scores(b, s, 6, 0.5, 0.1), boxes),
        "nms_v5_soft": (lambda b, s: tf.image.non_max_suppression_with_scores(b, s, 6, 0.4, 0.1,
                                                                              soft_nms_sigma=0.5), boxes),
        "nms_v5_padded": (v5, boxes),
        "nms_iou_edges": (lambda b, s: (tf.image.non_max_suppression(b, s, 6, 0.0),
                                        tf.image.non_max_suppression(b, s, 6, 1.0)), boxes),
    }


_R, _C, _RESHAPE, _SLICE = ("RFFT2D", 1), ("COMPLEX_ABS", 1), ("RESHAPE", 1), ("SLICE", 1)
_NMS4, _NMS5 = ("NON_MAX_SUPPRESSION_V4", 1), ("NON_MAX_SUPPRESSION_V5", 1)
_STFT = [_RESHAPE, ("GATHER", 1), _RESHAPE, ("MUL", 1), _RESHAPE, _R, _RESHAPE, _C]
#: (op, version) of TF 2.21's converter on each case (test_tf_writes_these_ops checks them).
TF_OPS = {
    "rfft_abs": [_RESHAPE, _R, _RESHAPE, _C],
    "rfft_pad_imag": [("PAD", 1), _RESHAPE, _R, _RESHAPE, ("IMAG", 1)],
    "rfft_crop_real": [_RESHAPE, _R, _RESHAPE, ("REAL", 1)],
    "rfft2d_real": [_R, ("REAL", 1)],
    "rfft2d_imag": [("PAD", 1), _R, ("IMAG", 1)],
    "rfft_dynamic": [("EXPAND_DIMS", 1), _R, ("SQUEEZE", 1), _C],
    "rfft_length_input": [("SUB", 1), ("MAXIMUM", 1), ("CONCATENATION", 1), ("PACK", 1), ("PAD", 1),
                          ("EXPAND_DIMS", 1), ("CONCATENATION", 1), _R, ("SQUEEZE", 1), _C],
    "complex_mul": [_RESHAPE, _R, _RESHAPE, ("MUL", 6), ("REAL", 1), ("MUL", 6), ("IMAG", 1), ("ADD", 1)],
    "complex_cast": [_RESHAPE, _R, _RESHAPE, ("CAST", 1), ("STRIDED_SLICE", 1), ("CAST", 1), _C, ("ADD", 1)],
    "stft": _STFT,
    "log_mel": _STFT + [("FULLY_CONNECTED", 5), ("LOG", 1)],
    "nms_v3": [_NMS4],
    "nms_v3_default": [_NMS4],
    "nms_v4_padded": [_NMS4],
    "nms_v5_hard": [_NMS5],
    "nms_v5_soft": [_NMS5],
    "nms_v5_padded": [_NMS5],
    "nms_iou_edges": [_NMS4, _NMS4],
}
#: Where kiln writes more: LiteRT's NMS outputs always hold max_output_size entries (zeros
#: after the selected ones), TF returns only the selected ones; kiln slices them to the count
#: (RESHAPE of the count, one SLICE per output), so the file returns what TensorFlow does.
KILN_EXTRA = {
    "nms_v3": [_RESHAPE, _SLICE], "nms_v3_default": [_RESHAPE, _SLICE],
    "nms_v5_hard": [_RESHAPE, _SLICE, _SLICE], "nms_v5_soft": [_RESHAPE, _SLICE, _SLICE],
    "nms_iou_edges": [_RESHAPE, _SLICE, _RESHAPE, _SLICE],
}
SIGNAL = [n for n in TF_OPS if not n.startswith("nms")]
NMS = [n for n in TF_OPS if n.startswith("nms")]


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


@functools.lru_cache(maxsize=None)
def _function(name: str):
    tf = zoo._tf()
    fn, specs = _cases(tf)[name]
    f = tf.function(fn, input_signature=specs)
    return f, f.get_concrete_function(), list(inspect.signature(fn).parameters)


@functools.lru_cache(maxsize=None)
def _converted(name: str) -> bytes:
    f, cf, _ = _function(name)
    return kiln.TFLiteConverter.from_concrete_functions([cf], f).convert()


def _ops(model: bytes) -> list[tuple[str, int]]:
    return [(op.name, op.version) for _, _, op in kiln.read_model(model).operators()]


def _interpreters(model: bytes):
    from ai_edge_litert.interpreter import Interpreter

    yield "LiteRT", Interpreter(model_content=model)
    yield "kiln", kiln.Interpreter(model_content=model)
    yield "kiln BUILTIN_REF", kiln.Interpreter(model_content=model,
                                               experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)


def _run(interp, feeds: dict) -> list[np.ndarray]:
    out = interp.get_signature_runner()(**feeds)
    return [out[k] for k in sorted(out, key=lambda k: int(k.rsplit("_", 1)[1]))]


def _reference(name: str, feeds: dict) -> list[np.ndarray]:
    f, _, _ = _function(name)
    out = f(**feeds)
    return [np.asarray(v) for v in (out if isinstance(out, (tuple, list)) else [out])]


def _assert_same(got: list, want: list, what: str, tol: float = 1e-4) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: output {i} {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: output {i}")
        else:
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True, err_msg=f"{what}: output {i}")


# -- feeds ---------------------------------------------------------------------------------------

def _signal_feeds(name: str) -> dict:
    rng = np.random.default_rng(1)
    _, cf, names = _function(name)
    feeds = {}
    for arg, spec in zip(names, cf.structured_input_signature[0]):
        if spec.dtype.name == "int32":
            feeds[arg] = np.array([16], np.int32)
            continue
        shape = [d if d is not None else 3 for d in spec.shape]
        x = rng.standard_normal(shape).astype(np.float32)
        rows = x.reshape(-1, shape[-1])
        if rows.shape[0] > 2 and not name.startswith("rfft2d"):
            # NaN reaches every bin of its 1-D transform, in TF and LiteRT alike (in 2-D, which
            # bins it reaches depends on the FFT's order of passes: TF's and LiteRT's differ).
            rows[0, 1] = np.nan
            rows[1] = 0.0
            rows[1, ::2] = -0.0
        feeds[arg] = x
    return feeds


def _f32(*rows):
    return np.array(rows, np.float32)


#: Boxes where TF's and LiteRT's rules meet at their edges (kiln's thresholds make LiteRT
#: follow TF there): an IoU exactly at the threshold, flipped corners, NaN / ±inf scores, a
#: score exactly at the score threshold (not above it).
SPECIAL = {
    "b": _f32([0, 0, 1, 2], [0, 0, 1, 1], [6, 6, 5, 5], [5, 5, 6, 6.5], [10, 10, 11, 11], [20, 20, 21, 21],
              [30, 30, 31, 31], [40, 40, 41, 41], [0.5, 0, 1.5, 1], [3, 3, 4, 4], [3.5, 3, 4.5, 4]),
    "s": _f32(0.9, 0.8, 0.7, 0.65, np.nan, 0.2, -np.inf, np.inf, 0.6, 0.3, 0.35),
}


def _random_boxes(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0, 1, (n, 2))
    hi = lo + rng.uniform(0.05, 0.5, (n, 2))
    b = np.concatenate([lo, hi], 1)
    flip = rng.random(n) < 0.3
    b[flip] = b[flip][:, [2, 3, 0, 1]]
    return {"b": b.astype(np.float32), "s": rng.permutation(n).astype(np.float32) / n}


# -- fast lane: one op at a time ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(TF_OPS))
def test_ops_are_tfs(name):
    """The builtins and versions TF's converter writes, nothing more (bar KILN_EXTRA)."""
    want = collections.Counter(TF_OPS[name] + KILN_EXTRA.get(name, []))
    assert collections.Counter(_ops(_converted(name))) == want


@pytest.mark.parametrize("name", SIGNAL)
def test_signal_matches_tf(name):
    feeds = _signal_feeds(name)
    want = _reference(name, feeds)
    for label, interp in _interpreters(_converted(name)):
        _assert_same(_run(interp, feeds), want, f"{name} in {label}")


@pytest.mark.parametrize("feed", ["special", "random"])
@pytest.mark.parametrize("name", NMS)
def test_nms_matches_tf(name, feed):
    feeds = SPECIAL if feed == "special" else _random_boxes(60, seed=len(name))
    want = _reference(name, feeds)
    for label, interp in _interpreters(_converted(name)):
        _assert_same(_run(interp, feeds), want, f"{name} on {feed} boxes in {label}", tol=1e-6)


#: Where LiteRT's NMS kernel itself departs from TensorFlow's, kiln's runtimes follow LiteRT
#: (a converter cannot reach inside the kernel): a zero-area box (IoU 0 even with itself) is
#: selected again after LiteRT re-queues it; equal scores come out in heap order, not by index;
#: at iou_threshold 1 an exact duplicate is suppressed (TF keeps it); a NaN corner is dropped
#: by std::min / std::max (the box becomes zero-area, see above) where TF keeps the NaN.
QUIRKS = {
    "nan_corner": ("nms_v5_soft", {"b": _f32([0, 0, 1, 1], [0, 0, np.nan, np.nan], [0, 0.1, 1, 1.1], [5, 5, 6, 6]),
                                   "s": _f32(0.9, 0.8, 0.75, 0.7)}),
    "zero_area": ("nms_v3_default", {"b": _f32([0, 0, 0, 0], [0, 0, 1, 1], [5, 5, 6, 6]), "s": _f32(0.9, 0.8, 0.7)}),
    "tied_scores": ("nms_v5_hard", {"b": _f32([0, 0, 1, 1], [2, 2, 3, 3], [5, 5, 6, 6], [8, 8, 9, 9]),
                                    "s": _f32(0.5, 0.5, 0.5, 0.5)}),
    "duplicate_at_iou_1": ("nms_iou_edges", {"b": _f32([0, 0, 1, 1], [0, 0, 1, 1], [5, 5, 6, 6]),
                                             "s": _f32(0.9, 0.8, 0.7)}),
}


@pytest.mark.parametrize("quirk", list(QUIRKS))
def test_nms_litert_quirks_are_litert_s(quirk):
    name, feeds = QUIRKS[quirk]
    runs = dict((label, _run(interp, feeds)) for label, interp in _interpreters(_converted(name)))
    for label, got in runs.items():
        _assert_same(got, runs["LiteRT"], f"{quirk}: {label} vs LiteRT", tol=0)
    assert any(g.shape != w.shape or not np.array_equal(g, w)
               for g, w in zip(runs["LiteRT"], _reference(name, feeds))), f"{quirk}: LiteRT now agrees with TF"


def test_rfft_length_known_at_run_time_only(tf):
    """A length that is not a power of two fails in LiteRT's Prepare; kiln says so too."""
    data = _converted("rfft_length_input")
    feeds = {"x": np.ones((2, 8), np.float32), "n": np.array([12], np.int32)}
    for label, interp in _interpreters(data):
        if label != "LiteRT":
            with pytest.raises(KilnError, match="(?i)powers? ?of ?two"):
                _run(interp, feeds)


def _refusal(tf, fn, specs) -> str:
    f = tf.function(fn, input_signature=specs)
    with pytest.raises(ConversionError) as info:
        kiln.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()
    return str(info.value)


@pytest.mark.parametrize("case", ["length_6", "length_1", "complex_slice", "complex_of_tensors", "float64", "iou_above_1",
                                  "negative_sigma"])
def test_what_litert_cannot_run_is_refused_by_name(tf, case):
    S, f32 = tf.TensorSpec, tf.float32
    b = [S([6, 4], f32), S([6], f32)]
    fn, specs, op, why = {
        "length_6": (lambda x: tf.abs(tf.signal.rfft(x, [6])), [S([2, 6], f32)], "RFFT", "powers of two"),
        "length_1": (lambda x: tf.math.imag(tf.signal.rfft(x, [1])), [S([2, 6], f32)], "RFFT",
                     "one-point transform wrongly"),  # LiteRT's imaginary parts are garbage there
        "complex_slice": (lambda x: tf.math.real(tf.signal.rfft(x)[:, 1:3]), [S([2, 8], f32)], "StridedSlice",
                          "STRIDED_SLICE takes no complex64"),
        "complex_of_tensors": (lambda x: tf.abs(tf.complex(x, x)), [S([2, 8], f32)], "Complex",
                               "no builtin that builds complex values"),
        "float64": (lambda x: tf.abs(tf.signal.rfft(tf.cast(x, tf.float64))), [S([2, 8], f32)], "RFFT",
                    "takes float32 only"),
        "iou_above_1": (lambda b, s: tf.image.non_max_suppression(b, s, 3, 1.5), b, "NonMaxSuppressionV3",
                        r"iou_threshold is 1.5, it must be in \[0, 1\]"),
        "negative_sigma": (lambda b, s: tf.image.non_max_suppression_with_scores(b, s, 3, soft_nms_sigma=-1.0), b,
                           "NonMaxSuppressionV5", "soft_nms_sigma is -1, it must be >= 0"),
    }[case]
    message = _refusal(tf, fn, specs)
    assert op in message
    assert __import__("re").search(why, message), message


# -- slow lane: TF's converter, whole models ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", list(TF_OPS))
def test_tf_writes_these_ops(name):
    f, cf, _ = _function(name)
    tf = zoo._tf()
    with zoo._silent_fd2():
        data = tf.lite.TFLiteConverter.from_concrete_functions([cf], f).convert()
    assert collections.Counter(_ops(data)) == collections.Counter(TF_OPS[name])


def _keras_front_end(tf, keras, frame_length=400, frame_step=160, fft_length=512, bins=40):
    """waveform [batch, samples] -> |stft| -> mel -> log -> a small conv head (4 logits)."""

    class LogMel(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.mel = tf.signal.linear_to_mel_weight_matrix(bins, fft_length // 2 + 1, 16000, 20.0, 4000.0)

        def call(self, wave):
            spectrum = tf.abs(tf.signal.stft(wave, frame_length, frame_step, fft_length))
            return tf.math.log(tf.matmul(spectrum, self.mel) + 1e-6)

    x = keras.Input((16000,))
    y = keras.layers.Reshape((-1, bins, 1))(LogMel()(x))
    y = keras.layers.Conv2D(8, 3, activation="relu")(y)
    y = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(y))
    return keras.Model(x, y)


def _keras_detector(tf, keras, size=32, classes=3, per_cell=2, max_out=20, score_threshold=0.55, sigma=0.5):
    """An SSD-style head: per-anchor box offsets and class logits from a conv net, boxes decoded
    against fixed anchors, then soft-NMS picks boxes; returns boxes, scores and their count."""
    grid = size // 4
    cy, cx = np.meshgrid((np.arange(grid) + 0.5) / grid, (np.arange(grid) + 0.5) / grid, indexing="ij")
    anchors = np.stack([np.repeat(cy.ravel(), per_cell), np.repeat(cx.ravel(), per_cell),
                        np.tile([0.2, 0.4], grid * grid), np.tile([0.2, 0.3], grid * grid)], -1).astype(np.float32)

    class SelectBoxes(keras.layers.Layer):
        def call(self, offsets, logits):
            a, r = tf.constant(anchors), offsets[0]
            cy, cx = a[:, 0] + r[:, 0] * 0.1 * a[:, 2], a[:, 1] + r[:, 1] * 0.1 * a[:, 3]
            h, w = a[:, 2] * tf.exp(r[:, 2] * 0.2), a[:, 3] * tf.exp(r[:, 3] * 0.2)
            boxes = tf.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)
            scores = tf.reduce_max(tf.sigmoid(logits[0]), axis=-1)
            picked, picked_scores = tf.image.non_max_suppression_with_scores(
                boxes, scores, max_out, 0.5, score_threshold, soft_nms_sigma=sigma)
            return tf.gather(boxes, picked), picked_scores, tf.size(picked)

    x = keras.Input((size, size, 3), batch_size=1)
    y = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    y = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(y)
    offsets = keras.layers.Reshape((-1, 4))(keras.layers.Conv2D(per_cell * 4, 3, padding="same")(y))
    logits = keras.layers.Reshape((-1, classes))(keras.layers.Conv2D(per_cell * classes, 3, padding="same")(y))
    return keras.Model(x, SelectBoxes()(offsets, logits))


def _randomized(model, scale: float):
    rng = np.random.default_rng(7)
    for w in model.weights:
        w.assign(rng.uniform(-scale, scale, tuple(w.shape)).astype(np.float32))
    return model


@functools.lru_cache(maxsize=None)
def _whole_model(which: str):
    """(keras model, saved model path, feed) for "front_end" or "detector"."""
    tf = zoo._tf()
    import keras

    rng = np.random.default_rng(3)
    path = tempfile.mkdtemp(prefix=f"kiln_{which}_")
    if which == "front_end":
        model = _randomized(_keras_front_end(tf, keras), 0.3)
        with zoo._silent_fd2():
            model.export(path, verbose=False)  # Keras 3's SavedModel export
        return model, path, rng.standard_normal((2, 16000)).astype(np.float32)
    # Small weights keep the class logits moderate: sigmoid saturates at exactly 1.0 for large
    # ones, and LiteRT's NMS orders tied scores differently from TF's (QUIRKS).
    model = _randomized(_keras_detector(tf, keras), 0.2)
    module = tf.Module()
    module.model = model
    module.detect = tf.function(lambda image: dict(zip(("boxes", "scores", "count"), model(image))),
                                input_signature=[tf.TensorSpec([1, 32, 32, 3], tf.float32, name="image")])
    tf.saved_model.save(module, path, signatures={"serving_default": module.detect})
    return model, path, rng.uniform(0, 1, (1, 32, 32, 3)).astype(np.float32)


def _check_model(data: bytes, feed: np.ndarray, want: list, what: str) -> None:
    for label, interp in _interpreters(data):
        runner = interp.get_signature_runner()
        (name,) = runner.get_input_details()
        out = runner(**{name: feed})
        got = [out[k] for k in sorted(out)]
        _assert_same(got, want, f"{what} in {label}", tol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["keras", "saved_model"])
@pytest.mark.parametrize("which", ["front_end", "detector"])
def test_whole_model_matches_tf(which, source):
    model, path, feed = _whole_model(which)
    outs = model(feed)
    outs = [np.asarray(v) for v in (outs if isinstance(outs, (tuple, list)) else [outs])]
    if which == "detector":
        # signature outputs sort as boxes, count, scores (SavedModel) / output_0..2 (Keras)
        outs = [outs[0], outs[2], outs[1]] if source == "saved_model" else outs
        assert 0 < int(outs[-1 if source == "keras" else 1]) < 20, "the feed should select some boxes, not all"
    conv = (kiln.TFLiteConverter.from_keras_model(model) if source == "keras"
            else kiln.TFLiteConverter.from_saved_model(path))
    data = conv.convert()
    ops = collections.Counter(op for op, _ in _ops(data))
    assert ops[{"front_end": "RFFT2D", "detector": "NON_MAX_SUPPRESSION_V5"}[which]] == 1
    _check_model(data, feed, outs, f"{which} from {source}")
