"""The one table of artefact formats (``FORMATS``), keyed by name: adding a format is one entry here,
its exporter module, and its runtime's loader.

Standard library only, and everything a format uses is named, not imported: boards read the records
(whose ``Format`` field takes its names from this table) with neither numpy nor a runtime, the device's
engines import only the loader of the format they load, and a device has no exporter at all.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Alternate:
    """A second runtime some artefacts of a format run in, and others must not.

    An artefact whose manifest record names ``runtime`` as its runtime was verified against it (a
    target may name it only for ``quants``, checked by ``records.target.Variant``); any other artefact
    of the format is refused there with ``why``, since the runtime may load it and compute garbage.
    """

    runtime: str  # pip name
    module: str  # import name; its package has an ``interpreter`` module like the format's own runtime
    why: str  # why it will not do for the artefacts that do not name it
    quants: tuple[str, ...]  # the only quants a target may name this runtime for


@dataclass(frozen=True)
class Format:
    """An artefact format as data: its file suffix, the runtime (pip name, import name) that runs it,
    and by name its loader, the host module that converts to it and the native program that times it.

    The converter imports ``exporter`` (a module satisfying ``convert.formats.Exporter``), the engines
    call ``loader`` (``"module:function"``, taking the artefact, threads and the runtime's import name,
    returning a step), calibrate's ``--runner`` runs ``native`` (``hydra_edge.measure.native``).
    """

    name: str
    suffix: str
    runtime: str  # the pip distribution a device installs
    module: str  # what the engine imports
    loader: str  # "module:function" that loads an artefact into the runtime (runtime.engines)
    exporter: str  # the host module that writes these artefacts
    native: str  # the native benchmark program for phones and boards without Python
    alternate: Alternate | None = None


# tflite-runtime 2.14.0 is its last release. It refuses the artefacts the PT2E dynamic-range path
# writes (their FULLY_CONNECTED ops are version 12, newer than it knows), and for the FC layers of
# ai-edge-quantizer's dynamic recipe it loads the model but returns wrong outputs without a word.
# The fp32 artefacts of the rpi-tflite-runtime target run in it (tests/test_tflite_runtime.py).
TFLITE_RUNTIME = Alternate(
    "tflite-runtime", "tflite_runtime",
    "its tflite-runtime cannot run these artefacts: 2.14, the last release, refuses FULLY_CONNECTED version 12; "
    "for a board with only tflite-runtime convert with --target rpi-tflite-runtime",
    quants=("fp32",))

FORMATS: dict[str, Format] = {
    "tflite": Format("tflite", ".tflite", runtime="ai-edge-litert", module="ai_edge_litert",
                     loader="hydra_edge.runtime.engines:load_tflite", exporter="hydra_edge.convert.tflite",
                     native="benchmark_model", alternate=TFLITE_RUNTIME),
    "executorch": Format("executorch", ".pte", runtime="executorch", module="executorch",
                         loader="hydra_edge.runtime.engines:load_pte", exporter="hydra_edge.convert.executorch",
                         native="executor_runner"),
    "onnx": Format("onnx", ".onnx", runtime="onnxruntime", module="onnxruntime",
                   loader="hydra_edge.runtime.engines:load_onnx", exporter="hydra_edge.convert.onnx", native="trtexec"),
}
