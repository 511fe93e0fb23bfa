"""SavedModels built in code for the inference converter tests (the original's documented examples)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SPEC = tf.TensorSpec([None, 4], tf.float32)


class ToyModel(tf.Module):
    """The original's example: a serving function calling an aliased accelerator function."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0)

    @tf.function
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 1.0}


def save_toy(path) -> str:
    m = ToyModel()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function()}, {"tpu_func": m.tpu_func})


class TwoFunctions(tf.Module):
    """Two accelerator functions behind two signatures, plus CPU work around them."""

    def __init__(self):
        self.a = tf.Variable(tf.ones([4, 4]) * 0.5)
        self.b = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))

    @tf.function
    def func_a(self, x):
        return tf.matmul(x, self.a)

    @tf.function
    def func_b(self, x):
        return tf.tanh(tf.matmul(x, self.b))

    @tf.function(input_signature=[SPEC])
    def serve_a(self, x):
        return {"a": self.func_a(x) * 2.0}

    @tf.function(input_signature=[SPEC])
    def serve_b(self, x):
        return {"b": self.func_b(tf.square(x)) - 1.0}


def save_two(path) -> str:
    m = TwoFunctions()
    return save_module(m, path, {"serve_a": m.serve_a.get_concrete_function(),
                                 "serve_b": m.serve_b.get_concrete_function()},
                       {"func_a": m.func_a, "func_b": m.func_b})


class Nested(tf.Module):
    """outer calls inner: both on the accelerator is the original's 'indirectly calls' error."""

    @tf.function
    def inner(self, x):
        return x * 3.0

    @tf.function
    def middle(self, x):
        return self.inner(x) + 1.0

    @tf.function
    def outer(self, x):
        return self.middle(x) - 2.0

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.outer(x)}


def save_nested(path) -> str:
    m = Nested()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function()},
                       {"inner": m.inner, "outer": m.outer})


class StringOps(tf.Module):
    """An accelerator function with string ops XLA cannot compile (and one taking strings)."""

    @tf.function
    def parse(self, x):
        return tf.strings.to_number(tf.strings.as_string(x)) * 2.0

    @tf.function
    def takes_strings(self, s):
        return tf.strings.length(s)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.string)])
    def serve(self, x, s):
        return {"y": self.parse(x), "n": self.takes_strings(s)}


def save_strings(path) -> str:
    m = StringOps()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function()},
                       {"parse": m.parse, "takes_strings": m.takes_strings})


class Unbatchable(tf.Module):
    """One function with a scalar input, one with a fixed 0th dimension."""

    @tf.function
    def scalar(self, x, k):
        return x * k

    @tf.function
    def fixed(self, x):
        return x + 1.0

    @tf.function(input_signature=[SPEC, tf.TensorSpec([], tf.float32)])
    def serve_scalar(self, x, k):
        return {"y": self.scalar(x, k)}

    @tf.function(input_signature=[tf.TensorSpec([3, 4], tf.float32)])
    def serve_fixed(self, x):
        return {"y": self.fixed(x)}


def save_unbatchable(path) -> str:
    m = Unbatchable()
    return save_module(m, path, {"serve_scalar": m.serve_scalar.get_concrete_function(),
                                 "serve_fixed": m.serve_fixed.get_concrete_function()},
                       {"scalar": m.scalar, "fixed": m.fixed})


class Slow(tf.Module):
    """A batched function that takes ~150 ms per call (to fill the batch queue)."""

    def __init__(self):
        self.calls = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def body(self, x):
        self.calls.assign_add(1)
        tf.py_function(lambda: __import__("time").sleep(0.15), [], [])
        return x * 2.0

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x)}


class Counting(tf.Module):
    """Counts inner calls and rows, to show concurrent requests are served in batches."""

    def __init__(self):
        self.calls = tf.Variable(0, dtype=tf.int64)
        self.rows = tf.Variable(0, dtype=tf.int64)
        self.biggest = tf.Variable(0, dtype=tf.int64)
        self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))

    @tf.function
    def body(self, x):
        n = tf.shape(x, out_type=tf.int64)[0]
        self.calls.assign_add(1)
        self.rows.assign_add(n)
        self.biggest.assign(tf.maximum(self.biggest, n))
        return tf.matmul(x, self.w)

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x)}

    @tf.function(input_signature=[])
    def stats(self):
        return {"calls": self.calls.read_value(), "rows": self.rows.read_value(),
                "biggest": self.biggest.read_value()}


def save_module(m, path, signatures, aliases) -> str:
    tf.saved_model.save(m, str(path), signatures=signatures,
                        options=tf.saved_model.SaveOptions(function_aliases=aliases))
    return str(path)


def save_tf1(path) -> str:
    """A model written by the TF1 SavedModel builder."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.identity(x * 2.0, name="y")
        with tf.compat.v1.Session(graph=graph) as sess:
            builder = tf.compat.v1.saved_model.Builder(str(path))
            sig = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
            builder.save()
    return str(path)


class SoftmaxHead(tf.Module):
    """An accelerator function ending in Softmax (kept float32: it feeds the output) with an Exp inside."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 7.0)

    @tf.function
    def head(self, x):
        h = tf.matmul(x, self.w)
        return tf.nn.softmax(h + tf.exp(-tf.abs(h)))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"p": self.head(x)}


class HasBFloat16(tf.Module):
    """A model that already computes in bfloat16 (the safety check refuses it)."""

    def __init__(self):
        self.w = tf.Variable(tf.ones([4, 3]) / 3.0)

    @tf.function
    def body(self, x):
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(self.w, tf.bfloat16)), tf.float32)

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x)}


class Mlp(tf.Module):
    """64 -> 32 -> 8 dense layers: big enough for TensorFlow's quantizer (>= 1024 weights per matrix)."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.w1 = tf.Variable(rng.standard_normal((64, 32)).astype(np.float32) / 8.0)
        self.w2 = tf.Variable(rng.standard_normal((32, 40)).astype(np.float32) / 6.0)

    @tf.function
    def body(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def serve(self, x):
        return {"y": self.body(x)}


class Sequence(tf.Module):
    """Per-token work on [batch, time, 4]: padding the time dimension does not change real tokens."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]) / 8.0)

    @tf.function
    def tokens(self, x):
        return tf.nn.relu(tf.einsum("btc,cd->btd", x, self.w))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 4], tf.float32)])
    def serve(self, x):
        return {"y": self.tokens(x)}


class MixesRows(tf.Module):
    """Subtracts the batch mean: zero rows of padding would change every result."""

    @tf.function
    def center(self, x):
        return x - tf.reduce_mean(x, axis=0, keepdims=True)

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.center(x)}


def save_keras_text_classifier(path) -> str:
    """tf_keras Embedding -> LayerNorm -> Conv1D(gelu) -> mean pooling -> BatchNorm -> Dense(softmax)."""
    import tf_keras as keras

    ids = keras.Input([None], dtype=tf.int32, name="ids")
    h = keras.layers.Embedding(50, 16)(ids)
    h = keras.layers.LayerNormalization()(h)
    h = keras.layers.Conv1D(8, 3, padding="same", activation="gelu")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    h = keras.layers.BatchNormalization()(h)
    model = keras.Model(ids, keras.layers.Dense(5, activation="softmax")(h))

    class Wrap(tf.Module):
        def __init__(self):
            self.model = model

        @tf.function
        def body(self, ids):
            return self.model(ids, training=False)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
        def serve(self, ids):
            return {"p": self.body(ids)}

    w = Wrap()
    return save_module(w, path, {"serving_default": w.serve.get_concrete_function()}, {"body": w.body})


class RunningMean(tf.Module):
    """Keeps state: a running mean of its outputs, subtracted from them; ``set_w`` overwrites the weights.

    Warm-up must never call ``set_w``; batching changes what the running mean sees (padding rows,
    batches instead of requests); bfloat16 must leave the state update in float32."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0)
        self.mean = tf.Variable(tf.zeros([3]))

    @tf.function
    def body(self, x):
        y = tf.matmul(x, self.w)
        self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(y, axis=0))
        return y - self.mean

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x)}

    @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32)])
    def set_w(self, w):
        self.w.assign(w)
        return {"ok": tf.constant(True)}

    @tf.function(input_signature=[])
    def state(self):
        return {"mean": self.mean.read_value(), "w": self.w.read_value()}


def save_running_mean(path) -> str:
    m = RunningMean()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function(),
                                 "set_w": m.set_w.get_concrete_function(),
                                 "state": m.state.get_concrete_function()}, {"body": m.body})


class Captures(tf.Module):
    """Batched functions that capture non-variable tensors: a tf.constant and a lookup table's default."""

    def __init__(self):
        self.scale = tf.constant([1.0, 2.0, 3.0, 4.0])
        self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]) / 8.0)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b", "c"], [1, 2, 3]), default_value=-1)

    @tf.function
    def body(self, x):
        return tf.matmul(x * self.scale, self.w)

    @tf.function
    def ids(self, words):
        return self.table.lookup(words)

    @tf.function(input_signature=[SPEC, tf.TensorSpec([None], tf.string)])
    def serve(self, x, words):
        return {"y": self.body(x), "ids": self.ids(words)}


def save_captures(path) -> str:
    m = Captures()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function()},
                       {"body": m.body, "ids": m.ids})


class NotBatchMajor(tf.Module):
    """Outputs whose dim 0 is not the batch: a flattened result (dynamic) and a column sum (static)."""

    @tf.function
    def flat(self, x):
        return tf.reshape(x * 2.0, [-1])

    @tf.function
    def total(self, x):
        return tf.reduce_sum(x, axis=0)

    @tf.function(input_signature=[SPEC])
    def serve_flat(self, x):
        return {"y": self.flat(x)}

    @tf.function(input_signature=[SPEC])
    def serve_total(self, x):
        return {"y": self.total(x)}


class RowsAndTotal(tf.Module):
    """A function returning a dict, one entry per row and one not (a column sum)."""

    @tf.function
    def body(self, x):
        return {"rows": x * 2.0, "total": tf.reduce_sum(x, axis=0)}

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return self.body(x)


class Sparse(tf.Module):
    """A function taking a SparseTensor: BatchFunction batches dense tensors only."""

    @tf.function
    def body(self, x):
        return tf.sparse.reduce_sum(x, axis=1)

    @tf.function(input_signature=[tf.SparseTensorSpec([None, 4], tf.float32)])
    def serve(self, x):
        return {"y": self.body(x)}


class ParsesStrings(tf.Module):
    """A signature taking CSV text ("0.5,1,2,3"): parsed on the CPU, the numbers go to ``body``.
    An empty string cannot be parsed, so zero-valued warm-up records would fail."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]) / 8.0)

    @tf.function
    def body(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, text):
        x = tf.strings.to_number(tf.strings.split(text, ",").to_tensor(shape=[None, 4]))
        return {"y": self.body(x)}


def save_parses_strings(path) -> str:
    m = ParsesStrings()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function()}, {"body": m.body})


def csv_rows(rows: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).uniform(-2, 2, (rows, 4))
    return np.array([",".join(f"{v:.3f}" for v in row).encode() for row in values], dtype=object)


class DirectCall(tf.Module):
    """``outer`` calls ``inner`` directly: both may be placed (the original allows direct calls)."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(16, dtype=tf.float32), [4, 4]) / 16.0)

    @tf.function
    def inner(self, x):
        return tf.matmul(x, self.w)

    @tf.function
    def outer(self, x):
        return tf.nn.relu(self.inner(x)) + 1.0

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.outer(x), "z": self.inner(x) * 2.0}


class ShapeFromInput(tf.Module):
    """``body`` reshapes with a shape computed outside it: not a compile-time constant for XLA."""

    @tf.function
    def body(self, x, n):
        return tf.reshape(x, [n[0], -1]) * 2.0

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x, tf.shape(x))}


class JitTwoSignatures(tf.Module):
    """A jit_compile=True function with an alias behind two signatures, and one without an alias:
    TensorFlow's quantizer inlines both and drops ``other`` unless kiln keeps the model whole."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((64, 32)).astype(np.float32) / 8.0)
        self.v = tf.Variable(rng.standard_normal((32, 8)).astype(np.float32) / 4.0)

    @tf.function(jit_compile=True)
    def body(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(jit_compile=True)
    def head(self, h):
        return tf.matmul(h, self.v)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def serve(self, x):
        return {"y": self.head(self.body(x))}

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def other(self, x):
        return {"z": self.body(x) * 2.0}


def save_jit_two_signatures(path) -> str:
    m = JitTwoSignatures()
    return save_module(m, path, {"serving_default": m.serve.get_concrete_function(),
                                 "other": m.other.get_concrete_function()}, {"body": m.body})


class FiltersRows(tf.Module):
    """Drops rows with a negative first value: dimension 0 of the output is known only when it runs."""

    @tf.function
    def body(self, x):
        return tf.boolean_mask(x, x[:, 0] > 0.0)

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.body(x)}


def save_keras_encoder(path) -> str:
    """A tf_keras transformer encoder block behind two signatures (pooled logits, per-token states),
    jit-compiled, reading an attention mask: padding positions must stay masked."""
    import tf_keras as keras

    vocab, width = 100, 32

    class Encoder(tf.Module):
        def __init__(self):
            self.embed = keras.layers.Embedding(vocab, width)
            self.attend = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
            self.norm1, self.norm2 = keras.layers.LayerNormalization(), keras.layers.LayerNormalization()
            self.ff1, self.ff2 = keras.layers.Dense(64, activation="gelu"), keras.layers.Dense(width)
            self.head = keras.layers.Dense(3)
            self.head(tf.zeros([1, width]))

        @tf.function(jit_compile=True)
        def encoder(self, ids, mask):
            h = self.embed(ids)
            h = self.norm1(h + self.attend(h, h, attention_mask=tf.cast(mask[:, None, :], tf.bool)))
            return self.norm2(h + self.ff2(self.ff1(h)))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)])
        def classify(self, ids, mask):
            h = self.encoder(ids, mask)
            weights = tf.cast(mask, tf.float32)[:, :, None]
            return {"logits": self.head(tf.reduce_sum(h * weights, 1) / tf.maximum(tf.reduce_sum(weights, 1), 1.0))}

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)])
        def encode(self, ids, mask):
            return {"hidden": self.encoder(ids, mask)}

    m = Encoder()
    return save_module(m, path, {"serving_default": m.classify.get_concrete_function(),
                                 "encode": m.encode.get_concrete_function()}, {"encoder": m.encoder})


def token_samples(count: int, seed: int = 0) -> list[dict]:
    """Sentences of 5 tokens, then of 9 (two lengths: each new shape costs an XLA compilation per measured
    model), one per sample, with their all-ones masks."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = 5 if i < count // 2 else 9
        out.append({"ids": rng.integers(1, 100, (1, n)).astype(np.int32), "mask": np.ones((1, n), np.int32)})
    return out
