"""Conversion benchmark: kiln vs TensorFlow's converter on the converter test zoo.

For each zoo model, one run of each converter (creation + tracing + convert, the way a user
calls them) and the ratios kiln / TF of conversion time, operator count, file size, total
multiply-accumulates (at the shapes a run produces) and LiteRT latency (the two models
invoked alternately on the same inputs, median of LATENCY_RUNS each). Goals: time <= 0.5,
ops, size, MACs and latency <= 1. Models TF's converter cannot convert are listed as such.

    python bench/convert_bench.py [NAME ...]      (default: the whole zoo)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.converter import zoo  # noqa: E402

LATENCY_RUNS = 200


def _litert_invoker(model: bytes, key: str, feeds: dict):
    """A zero-argument call that sets ``feeds`` and invokes ``model`` in LiteRT — the same
    set_tensor + invoke path for every model (a signature runner would add Python work)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    signatures = interp.get_signature_list()
    if key in signatures:
        runner = interp.get_signature_runner(key)
        if "__first__" in feeds:
            feeds = {next(iter(runner.get_input_details())): feeds["__first__"]}
        runner(**feeds)   # sizes the inputs once
        if len(signatures) > 1:   # its subgraph may not be the main one: the runner sets it
            return lambda: runner(**feeds)
        slots = [(runner.get_input_details()[name]["index"], np.asarray(v)) for name, v in feeds.items()]
    else:
        details = interp.get_input_details()
        for d, value in zip(details, feeds.values()):
            interp.resize_tensor_input(d["index"], np.shape(value))
        interp.allocate_tensors()
        slots = [(d["index"], np.asarray(v)) for d, v in zip(details, feeds.values())]

    def invoke():
        for index, value in slots:
            interp.set_tensor(index, value)
        interp.invoke()
    return invoke


def latency_ratio(kiln_model: bytes, tf_model: bytes, key: str, feeds: dict) -> float:
    """Median LiteRT latency of kiln's model ÷ TF's, interleaved so both see the same load."""
    ours, theirs = _litert_invoker(kiln_model, key, feeds), _litert_invoker(tf_model, key, feeds)
    times = {"kiln": [], "tf": []}
    for _ in range(LATENCY_RUNS):
        for label, call in (("kiln", ours), ("tf", theirs)):
            start = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - start)
    return float(np.median(times["kiln"]) / np.median(times["tf"]))


def main(names: list[str]) -> int:
    names = names or list(zoo.BUILDERS)
    unknown = [n for n in names if n not in zoo.BUILDERS]
    if unknown:
        print(f"unknown zoo models: {', '.join(unknown)}; known: {', '.join(zoo.BUILDERS)}")
        return 2
    # Warm up both converters once (module imports, first tracing) so the timings compare
    # conversions, not Python imports.
    warm = zoo.BUILDERS["k3_mlp"]()
    zoo.convert_kiln(warm)
    zoo.convert_tf(warm)
    header = (f"{'model':<22} {'kiln s':>7} {'tf s':>7} {'time':>6} {'ops':>9} {'op ratio':>8} {'size kB':>15} "
              f"{'size':>6} {'MACs':>6} {'latency':>7}")
    print(header)
    print("-" * len(header))
    time_ratios, op_ratios, size_ratios, mac_ratios, latency_ratios = [], [], [], [], []
    for name in names:
        src = zoo.BUILDERS[name]()
        kiln_bytes, _, kiln_s = zoo.convert_kiln(src)
        tf_bytes, tf_s, tf_error = zoo.convert_tf(src)
        k_ops = zoo.op_count(kiln_bytes)
        if tf_bytes is None:
            print(f"{name:<22} {kiln_s:7.3f} {'-':>7} {'-':>6} {k_ops:>4} /  - {'-':>8} "
                  f"{len(kiln_bytes) / 1e3:7.1f} /   - {'-':>6}   TF's converter fails")
            continue
        t_ops = zoo.op_count(tf_bytes)
        tr, orr, sr = kiln_s / tf_s, k_ops / t_ops, len(kiln_bytes) / len(tf_bytes)
        key, feeds = next(iter(src.feeds.items()))
        tf_macs = zoo.run_macs(tf_bytes, key, feeds)
        mr = zoo.run_macs(kiln_bytes, key, feeds) / tf_macs if tf_macs else 1.0
        lr = latency_ratio(kiln_bytes, tf_bytes, key, feeds)
        for ratios, value in ((time_ratios, tr), (op_ratios, orr), (size_ratios, sr), (mac_ratios, mr),
                              (latency_ratios, lr)):
            ratios.append(value)
        print(f"{name:<22} {kiln_s:7.3f} {tf_s:7.3f} {tr:6.2f} {k_ops:>4}/{t_ops:<4} {orr:8.2f} "
              f"{len(kiln_bytes) / 1e3:7.1f}/{len(tf_bytes) / 1e3:<7.1f} {sr:6.2f} {mr:6.2f} {lr:7.2f}")
    if time_ratios:
        def gmean(xs):
            prod = 1.0
            for x in xs:
                prod *= x
            return prod ** (1 / len(xs))

        print("-" * len(header))
        for label, pick in (("geometric mean", gmean), ("worst", max)):
            print(f"{label:<22} {'':>7} {'':>7} {pick(time_ratios):6.2f} {'':>9} {pick(op_ratios):8.2f} "
                  f"{'':>15} {pick(size_ratios):6.2f} {pick(mac_ratios):6.2f} {pick(latency_ratios):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
