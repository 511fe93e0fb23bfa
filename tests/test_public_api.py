"""Pins kiln's public surface: changing it must be a deliberate act."""

import kiln

EXPECTED = {
    "Activation", "BuiltinOpResolver", "CompositeCall", "ConversionError", "DType", "Delegate",
    "DelegateKernel", "Interpreter", "InterpreterError", "KilnError", "ModelError", "MutableOpResolver",
    "NodeInfo", "NotFusable", "OpError", "Optimize", "OpsSet", "Padding", "Partition", "Registration",
    "RegistrationError", "SignatureRunner", "TFLiteConverter", "UnsupportedError", "read_model",
    "register_fusion", "save_model", "unregister_fusion", "write_model", "__version__",
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
