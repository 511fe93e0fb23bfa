"""LiteRT's integer and hybrid arithmetic as pure functions, bit-exact with its reference kernels.

Below the op records (`kiln.ops`), whose quantized kernels (kiln/ops/quantized_kernels.py)
adapt a node to these functions, and below kiln.delegates and kiln.xla, which reuse them.
One module per op family, as in kiln/ops: `nn` (weighted, windowed, reducing ops,
CONCATENATION; legacy uint8), `elementwise`, `activations` (unary ops, int8 and 16x8 lookup
tables, PRELU, L2_NORMALIZATION), `image`, `lstm` (the 8x8->16 LSTM step), `hybrid`
(dynamic-range kernels); `fixedpoint` holds LiteRT's fixed-point primitives (also over an
array namespace, for kernels written once for NumPy and jax.numpy) and `gemmlowp` its
int16 sigmoid / tanh tables. Nothing here knows about IR nodes or the interpreter.
"""
