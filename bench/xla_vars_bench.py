"""Resource variables through XlaDelegate: per-invoke time against the reference kernels
(the anchor, measured in the same run) and kiln's default NumPy delegate.

Models: the runtime zoo's "variables" (tf.Module, signatures 'accumulate' and 'read'; a
2x3 total), and a kiln-IR accumulator over an N x N float32 variable (acc += x; y = acc * 2)
where the variable only lives in the XLA partition. For the latter the "host round trip" row
makes a reader outside XLA ask for the variable after every invoke and writes it back as a
NumPy array (what a delegate without device-held variables would do), so the row against
"XLA" shows what keeping the variable in device memory saves. Engines take turns in short
rounds; the figures are the median per-invoke time of the rounds.

    python bench/xla_vars_bench.py [--seconds 1] [--n 512]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln import ops  # noqa: E402
from kiln.format import write_model  # noqa: E402
from kiln.ir import Model  # noqa: E402
from kiln.schema import DType  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.runtime import zoo  # noqa: E402


def accumulator(n: int) -> bytes:
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (n, n))
    sg.inputs.append(x)
    init = model.add_subgraph("init")
    hi = init.add_tensor("h", DType.RESOURCE, ())
    init.add_operator("VAR_HANDLE", [], [hi], options={"container": "", "shared_name": "acc"})
    init.add_operator("ASSIGN_VARIABLE", [hi, init.add_constant("zeros", np.zeros((n, n), np.float32))], [])
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": 1})
    h = sg.add_tensor("h", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": "acc"})
    old = sg.add_tensor("old", DType.FLOAT32, (n, n))
    sg.add_operator("READ_VARIABLE", [h], [old])
    new = sg.add_tensor("new", DType.FLOAT32, (n, n))
    sg.add_operator("ADD", [old, x], [new])
    sg.add_operator("ASSIGN_VARIABLE", [h, new], [])
    y = sg.add_tensor("y", DType.FLOAT32, (1, 1))
    sg.add_operator("SLICE", [new, sg.add_constant("begin", np.zeros(2, np.int32)),
                              sg.add_constant("size", np.ones(2, np.int32))], [y])
    sg.outputs.append(y)
    for s in model.subgraphs:
        for op in s.operators:
            op.version = ops.require(op.op_type).version(op)
    return write_model(model)


def engines(data: bytes) -> dict:
    ref = kiln.Interpreter(model_content=data, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    return {"reference kernels": ref, "NumPy delegate": kiln.Interpreter(model_content=data),
            "XLA": kiln.Interpreter(model_content=data, experimental_delegates=[XlaDelegate()])}


def timed_rounds(calls: dict, seconds: float, rounds: int = 7) -> dict:
    for call in calls.values():  # warm up: compiles, CALL_ONCE
        call()
        call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / rounds:
                call()
                n += 1
            times[name].append((time.perf_counter() - start) / n)
    return {name: float(np.median(t)) for name, t in times.items()}


def report(title: str, medians: dict) -> None:
    anchor = medians["reference kernels"]
    print(f"\n{title}")
    for name, t in medians.items():
        print(f"  {name:28s} {t * 1e6:9.1f} us   x{anchor / t:5.2f} vs reference kernels")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=512)
    args = parser.parse_args()

    data = zoo.zoo_bytes("variables")
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    calls = {name: (lambda r=interp.get_signature_runner("accumulate"): r(x=x))
             for name, interp in engines(data).items()}
    report("runtime zoo 'variables', signature 'accumulate' (2x3 variable)", timed_rounds(calls, args.seconds))

    data = accumulator(args.n)
    x = np.random.default_rng(1).standard_normal((args.n, args.n)).astype(np.float32)
    interps = engines(data)
    interps["XLA, host round trip"] = kiln.Interpreter(model_content=data, experimental_delegates=[XlaDelegate()])
    calls = {}
    for name, interp in interps.items():
        interp.allocate_tensors()
        index = interp.get_input_details()[0]["index"]

        def call(interp=interp, index=index, round_trip=name.endswith("round trip")):
            interp.set_tensor(index, x)
            interp.invoke()
            if round_trip:
                store = interp._runtime.variables
                for rid in list(store):
                    store[rid] = np.array(store[rid])
        calls[name] = call
    report(f"accumulator over a {args.n}x{args.n} float32 variable (set_tensor included)",
           timed_rounds(calls, args.seconds))


if __name__ == "__main__":
    main()
