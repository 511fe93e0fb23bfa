"""Batch inference with Apache Beam: rows of a .npy file through a .tflite model, on any runner.

The pipeline keys each row by its index, runs RunInference with `kiln.beam.KilnModelHandler`
(Beam batches the rows as the model's batch dimension allows) and writes one JSON line per row:
``{"key": 3, "output_0": [...], ...}``.

Run locally (DirectRunner):

    python examples/beam_pipeline.py --output /tmp/predictions
    python examples/beam_pipeline.py --model model.tflite --input rows.npy --output /tmp/predictions
    python examples/beam_pipeline.py --model two_inputs.tflite --input rows.npz --output /tmp/predictions

Without --model it converts a small Keras model with kiln first (needs TensorFlow); without
--input it makes 100 random rows for the model's input.

The same file runs unchanged on a distributed runner: every argument it does not know is a Beam
pipeline option, and the model is read through Beam's file systems, so put it where the
workers can read it and install kiln on them (``pip install 'kiln[beam]'`` in a
requirements file, or ``--extra_package dist/kiln-0.1.0.tar.gz`` from ``python -m build --sdist``):

    # Google Cloud Dataflow
    python examples/beam_pipeline.py --model gs://BUCKET/model.tflite --input rows.npy \\
        --output gs://BUCKET/predictions --runner DataflowRunner --project PROJECT \\
        --region REGION --temp_location gs://BUCKET/tmp --requirements_file requirements.txt
    # Apache Flink / Apache Spark (portable runners)
    python examples/beam_pipeline.py ... --runner FlinkRunner --flink_master HOST:8081
    python examples/beam_pipeline.py ... --runner SparkRunner --spark_master_url spark://HOST:7077

The workers read the .npy/.npz themselves (through Beam's file systems, so it may be on gs://);
a production pipeline would read its examples with a Beam source (ReadFromTFRecord,
ReadFromParquet, ...) the same way.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from kiln import extras


def _missing_extra(exc: ImportError) -> None:
    """A missing extra is one line naming the pip command, exit status 2 (as the kiln command)."""
    missing = exc if isinstance(exc, extras.MissingExtraError) else extras.from_import_error(exc, "")
    if missing is None:
        raise exc
    print(f"examples/beam_pipeline.py: error: {missing}", file=sys.stderr)
    raise SystemExit(2)


try:
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    from kiln.beam import KilnModelHandler
except ImportError as exc:
    _missing_extra(exc)


def example_model(directory: str) -> str:
    """A small Keras classifier converted by kiln; returns the .tflite path."""
    import keras

    import kiln

    model = keras.Sequential([keras.Input((8,), name="features"), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    path = Path(directory) / "classifier.tflite"
    path.write_bytes(kiln.TFLiteConverter.from_keras_model(model).convert())
    return str(path)


def random_rows(handler: KilnModelHandler, n: int, seed: int = 0) -> np.ndarray:
    """``n`` random rows for a single-input model (free dimensions get size 4)."""
    spec = handler.spec()
    if len(spec.inputs) != 1:
        raise SystemExit(f"the model has {len(spec.inputs)} inputs; pass rows with --input")
    (tensor,) = spec.inputs.values()
    shape = [4 if d == -1 else d for d in spec.row_shape(tensor)]
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype(tensor.dtype)


def read_rows(path: str):
    """(index, row) for each row of a .npy (single-input models) or .npz (one array per input name).

    Runs on a worker: the file is read through Beam's file systems (gs://... on Dataflow).
    """
    with FileSystems.open(path) as f:
        data = np.load(io.BytesIO(f.read()))
    if isinstance(data, np.ndarray):
        yield from enumerate(data)
        return
    columns = {name: data[name] for name in data.files}
    for i in range(len(next(iter(columns.values())))):
        yield i, {name: column[i] for name, column in columns.items()}


def to_json(keyed: tuple[int, PredictionResult]) -> str:
    key, result = keyed
    return json.dumps({"key": key, **{name: np.asarray(v).tolist() for name, v in result.inference.items()}})


def build(pipeline: beam.Pipeline, handler: KilnModelHandler, rows_path: str, output: str) -> None:
    """.npy/.npz -> (index, row) -> RunInference -> JSON lines under ``output``."""
    _ = (pipeline
         | "Path" >> beam.Create([rows_path])
         | "Rows" >> beam.FlatMap(read_rows)
         | "Spread" >> beam.Reshuffle()  # on a distributed runner, rows leave the one reader
         | "Predict" >> RunInference(KeyedModelHandler(handler))
         | "ToJson" >> beam.Map(to_json)
         | "Write" >> beam.io.WriteToText(output, file_name_suffix=".jsonl"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help=".tflite path (any Beam file system); default: convert a small Keras model")
    parser.add_argument("--input", help=".npy of rows, or .npz of one array per input name (first axis: rows); "
                                        "default: random rows")
    parser.add_argument("--output", required=True, help="output prefix for the JSON-lines files")
    parser.add_argument("--backend", default="kiln", choices=["kiln", "litert", "xla"])
    parser.add_argument("--signature_key", default=None)
    args, beam_args = parser.parse_known_args(argv)
    try:
        if args.model is None:
            extras.require("tf", "converting the example model (no --model given)")
        if args.backend == "xla":
            extras.require("xla", "--backend xla")
    except extras.MissingExtraError as exc:
        _missing_extra(exc)
    with tempfile.TemporaryDirectory() as scratch:
        handler = KilnModelHandler(args.model or example_model(scratch), backend=args.backend,
                                   signature_key=args.signature_key)
        rows_path = args.input
        if rows_path is None:
            rows_path = str(Path(scratch) / "rows.npy")
            np.save(rows_path, random_rows(handler, 100))
        with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
            build(pipeline, handler, rows_path, args.output)
    print(f"wrote predictions for the rows of {rows_path} to {args.output}-*.jsonl")


if __name__ == "__main__":
    main()
