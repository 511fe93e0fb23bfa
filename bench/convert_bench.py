"""Conversion benchmark: kiln vs TensorFlow's converter on the converter test zoo.

For each zoo model, one run of each converter (creation + tracing + convert, the way a user
calls them) and the ratios kiln / TF of conversion time, operator count and file size. Goals:
time <= 0.5, ops <= 1, size <= 1. Models TF's converter cannot convert are listed as such.

    python bench/convert_bench.py [NAME ...]      (default: the whole zoo)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.converter import zoo  # noqa: E402


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
    header = f"{'model':<22} {'kiln s':>7} {'tf s':>7} {'time':>6} {'ops':>9} {'op ratio':>8} {'size kB':>15} {'size':>6}"
    print(header)
    print("-" * len(header))
    time_ratios, op_ratios, size_ratios = [], [], []
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
        time_ratios.append(tr)
        op_ratios.append(orr)
        size_ratios.append(sr)
        print(f"{name:<22} {kiln_s:7.3f} {tf_s:7.3f} {tr:6.2f} {k_ops:>4}/{t_ops:<4} {orr:8.2f} "
              f"{len(kiln_bytes) / 1e3:7.1f}/{len(tf_bytes) / 1e3:<7.1f} {sr:6.2f}")
    if time_ratios:
        def gmean(xs):
            prod = 1.0
            for x in xs:
                prod *= x
            return prod ** (1 / len(xs))

        print("-" * len(header))
        print(f"{'geometric mean':<22} {'':>7} {'':>7} {gmean(time_ratios):6.2f} {'':>9} {gmean(op_ratios):8.2f} "
              f"{'':>15} {gmean(size_ratios):6.2f}")
        print(f"{'worst':<22} {'':>7} {'':>7} {max(time_ratios):6.2f} {'':>9} {max(op_ratios):8.2f} "
              f"{'':>15} {max(size_ratios):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
