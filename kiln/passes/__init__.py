"""Rewrites of kiln's IR under a pass manager (see `manager`).

`optimization_passes()` is the converter's standard pipeline: folding, no-op removal,
canonicalisation and the fusions that turn a legalised TF graph into compact TFLite code.
"""

from __future__ import annotations

from .activation import FuseActivations
from .affine import FoldAffine
from .bias import FuseBias
from .canonicalize import Canonicalize
from .cse import EliminateCommonSubexpressions
from .dce import DeadCodeElimination, prune_subgraphs
from .dilated import FuseDilatedConv
from .fold import ConstantFolding, fold_operator
from .identity import RemoveNoOps
from .loops import RemoveDeadLoopVariables
from .manager import (
    FunctionPass,
    OperatorPass,
    Pass,
    PassError,
    PassManager,
    PassStats,
    RulePass,
    check_invariants,
    run_passes,
)
from .pad import FusePadIntoConv
from .shapes import ShapeInference
from .versioning import AssignVersions


def optimization_passes() -> list[Pass]:
    """The converter's optimisation pipeline (run to a fixed point)."""
    return [
        ConstantFolding(), RemoveNoOps(), ShapeInference(), Canonicalize(), FuseDilatedConv(),
        FusePadIntoConv(), FoldAffine(), FuseBias(), FuseActivations(), EliminateCommonSubexpressions(),
        RemoveDeadLoopVariables(), DeadCodeElimination(),
    ]


__all__ = [
    "AssignVersions", "Canonicalize", "ConstantFolding", "DeadCodeElimination", "EliminateCommonSubexpressions", "FoldAffine",
    "FunctionPass", "FuseActivations", "FuseBias", "FuseDilatedConv", "FusePadIntoConv", "OperatorPass", "Pass", "PassError", "PassManager",
    "PassStats", "RemoveDeadLoopVariables", "RulePass", "RemoveNoOps", "ShapeInference", "check_invariants", "fold_operator", "optimization_passes",
    "prune_subgraphs", "run_passes",
]
