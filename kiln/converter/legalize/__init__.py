"""Legalisation: one table {TF op type: emitter}, gathered from one module per op family.

Each module (math, nn, array, scatter, random, image, signal, variables, control, tensorlist, einsum) defines its own
``EMITTERS`` dict; the families are listed here explicitly.
"""

from __future__ import annotations

from . import array, control, einsum, image, math, nn, random, scatter, signal, tensorlist, variables

_FAMILIES = (math, nn, array, scatter, random, image, signal, variables, control, tensorlist, einsum)


def _collect() -> dict:
    table: dict = {}
    for family in _FAMILIES:
        for name, fn in family.EMITTERS.items():
            if name in table:
                raise RuntimeError(f"TF op {name} legalised twice ({family.__name__})")
            table[name] = fn
    return table


#: TF op type -> emitter(ctx) for every TF op kiln legalises.
EMITTERS = _collect()

__all__ = ["EMITTERS"]
