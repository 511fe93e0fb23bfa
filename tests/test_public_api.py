"""Pins kiln's public surface: changing it must be a deliberate act."""

import kiln

EXPECTED = {
    "Activation", "BuiltinOpResolver", "CompositeCall", "ConversionError", "DType", "Delegate",
    "DelegateKernel", "Interpreter", "InterpreterError", "KilnError", "LiteRtDelegate", "ModelError",
    "MutableOpResolver", "NodeInfo", "NotFusable", "OpError", "OpResolverType", "Optimize", "OpsSet", "Padding", "Partition",
    "QuantizationDebugger", "Registration", "RegistrationError", "SignatureRunner", "TFLiteConverter", "UnsupportedError",
    "XlaDelegate", "quantize", "read_model",
    "register_fusion", "save_model", "to_jax", "unregister_fusion", "write_model", "__version__",
}


def test_public_surface_is_pinned():
    assert set(kiln.__all__) == EXPECTED


def test_every_error_derives_from_kiln_error():
    for name in ("ModelError", "OpError", "RegistrationError", "InterpreterError", "ConversionError",
                 "UnsupportedError", "NotFusable"):
        assert issubclass(getattr(kiln, name), kiln.KilnError)


def test_runtime_import_does_not_pull_in_tensorflow():
    import subprocess
    import sys

    code = "import sys, kiln; kiln.Interpreter; assert 'tensorflow' not in sys.modules, 'tf imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _modules_after(code: str) -> set[str]:
    """kiln's modules in sys.modules after running ``code`` in a fresh interpreter."""
    import subprocess
    import sys

    probe = code + "\nimport sys; print(' '.join(m for m in sys.modules if m.startswith('kiln')))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_runtime_import_leaves_converter_and_fusion_out():
    loaded = _modules_after("import kiln; kiln.Interpreter; kiln.read_model")
    assert "kiln.runtime" in loaded
    assert not {m for m in loaded if m.startswith(("kiln.converter", "kiln.fusion"))}, sorted(loaded)


def test_registering_a_fusion_loads_the_registry_only():
    loaded = _modules_after("import kiln; kiln.register_fusion; kiln.NotFusable")
    assert "kiln.fusion.registry" in loaded
    heavy = {"kiln.fusion.keras", "kiln.fusion.lstm", "kiln.fusion.helpers", "kiln.fusion.builtin"}
    assert not heavy & loaded and not {m for m in loaded if m.startswith("kiln.converter")}, sorted(loaded)
