"""``kiln convert SRC -o OUT.tflite``: a SavedModel directory or a .keras / .h5 file to .tflite.

Wired into the ``kiln`` command by kiln/cli.py through `add_parser` and `run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile
from pathlib import Path

from ..errors import ConversionError
from ..paths import writable_file, write_bytes, write_text
from .tfutil import import_tensorflow_quietly


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``convert`` subcommand."""
    p = subparsers.add_parser(
        "convert", help="convert a TensorFlow model (SavedModel dir, .keras or .h5 file) to .tflite",
        description="Convert a SavedModel directory or a Keras .keras / .h5 file to a LiteRT model.")
    p.add_argument("source", help="SavedModel directory, or .keras / .h5 Keras model file")
    p.add_argument("-o", "--output", help="output .tflite path (default: SOURCE with .tflite)")
    p.add_argument("--signature-keys", metavar="KEYS",
                   help="comma-separated SavedModel signatures to convert (default: serving_default)")
    p.add_argument("--tags", metavar="TAGS", help="comma-separated SavedModel tags (default: serve)")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="emit unsupported TF ops as custom ops instead of failing")
    p.add_argument("--no-resource-variables", dest="resource_variables", action="store_false",
                   help="refuse models that assign variables")
    p.add_argument("--explain", nargs="?", const="all", choices=("all", "declined"),
                   help="print the rewrite decisions (stage, subject, rule, fired, reason) as a table: "
                        "all of them, or only those that declined (--explain declined)")
    p.add_argument("--report-json", metavar="FILE",
                   help="write the conversion report, decisions included, as JSON to FILE")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors (and --explain's table)")
    p.set_defaults(func=run)
    return p


def _output_path(source: Path, output: str | None) -> Path:
    if output:
        return Path(output)
    base = source.with_suffix("") if source.is_file() else source
    return Path(f"{str(base).rstrip(os.sep)}.tflite")


def _load_keras(path: Path):
    """A Keras model from a .keras / .h5 file (Keras 3 first, then tf_keras for legacy H5)."""
    errors = {}
    try:
        import keras

        return keras.saving.load_model(str(path), compile=False)
    except Exception as exc:  # noqa: BLE001 - fall back to tf_keras for Keras 2 files
        errors["keras"] = str(exc)
    if path.suffix in (".h5", ".hdf5"):
        try:
            import tf_keras
        except ImportError:
            errors["tf_keras"] = "not installed (Keras 2 .h5 files: pip install --no-deps 'tf-keras==2.21.*')"
        else:
            try:
                return tf_keras.models.load_model(str(path), compile=False)
            except Exception as exc:  # noqa: BLE001
                errors["tf_keras"] = str(exc)
    if len(set(errors.values())) == 1:   # both readers say the same (a truncated HDF5 file): once
        raise ConversionError(f"cannot load Keras model {str(path)!r}: {next(iter(errors.values()))}")
    raise ConversionError(f"cannot load Keras model {str(path)!r}: "
                          + "; ".join(f"{reader}: {why}" for reader, why in errors.items()))


def _check_keras_file(source: Path) -> None:
    """A .keras file is a zip archive, an .h5 file HDF5: a truncated or foreign file is named as
    such here (Keras itself calls a damaged .keras "File not found")."""
    if source.suffix == ".keras":
        if not zipfile.is_zipfile(source):
            raise ConversionError(f"{str(source)!r} is not a readable .keras file: a .keras file is a zip archive, "
                                  f"and this one has no zip directory (truncated or damaged, {source.stat().st_size:,} "
                                  "bytes)")
        try:
            with zipfile.ZipFile(source) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            bad = f"({exc})"
        if bad:
            raise ConversionError(f"{str(source)!r} is a damaged .keras file: its member {bad} does not read back")
    else:
        with open(source, "rb") as f:
            if f.read(8) != b"\x89HDF\r\n\x1a\n":
                raise ConversionError(f"{str(source)!r} is not an HDF5 file (Keras 2 .h5 files are)")


def check_source(source: Path) -> None:
    """Refuse a source that is not a SavedModel directory or a .keras / .h5 file — before
    TensorFlow is imported, so a wrong path costs no TensorFlow start-up."""
    if source.is_dir():
        if not (source / "saved_model.pb").exists() and not (source / "saved_model.pbtxt").exists():
            raise ConversionError(f"{str(source)!r} is a directory but not a SavedModel (no saved_model.pb)")
        return
    if not source.exists():
        raise ConversionError(f"{str(source)!r} does not exist")
    if source.suffix not in (".keras", ".h5", ".hdf5"):
        raise ConversionError(f"cannot tell what {str(source)!r} is: give a SavedModel directory or a .keras / "
                              ".h5 file")
    _check_keras_file(source)


def make_converter(source: Path, *, signature_keys=None, tags=None):
    from .api import TFLiteConverter

    check_source(source)
    if source.is_dir():
        return TFLiteConverter.from_saved_model(str(source), signature_keys=signature_keys, tags=tags)
    return TFLiteConverter.from_keras_model(_load_keras(source))


def run(args) -> int:
    """Convert and write; prints a short summary (ops, size, time, fusions). Where the model and
    the report go is checked before converting: a bad path costs no conversion, and never
    leaves the model written without its report."""
    source = Path(args.source)
    check_source(source)
    out = writable_file(_output_path(source, args.output), "-o/--output")
    if args.report_json:
        writable_file(args.report_json, "--report-json")
    import_tensorflow_quietly()
    keys = [k for k in args.signature_keys.split(",") if k] if args.signature_keys else None
    tags = [t for t in args.tags.split(",") if t] if args.tags else None
    converter = make_converter(source, signature_keys=keys, tags=tags)
    converter.allow_custom_ops = bool(args.allow_custom_ops)
    converter.experimental_enable_resource_variables = bool(args.resource_variables)
    data = converter.convert()
    report = converter.report
    if args.report_json:
        write_text(args.report_json, json.dumps(report.to_dict(), indent=1) + "\n", "--report-json")
    write_bytes(out, data, "-o/--output")
    if not args.quiet:
        print(f"wrote {out}")
        print(report.summary())
    if args.explain:
        print(report.explain(declined_only=args.explain == "declined"))
    sys.stdout.flush()
    return 0
