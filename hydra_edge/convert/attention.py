"""How an int8 artefact's attention matmuls are quantised: the target option both XNNPACK formats read.

The attention's two batch matmuls (Q x K^T and softmax x V) multiply activation by activation, so
dynamic-range int8 (int8 weights) leaves them in float32. XNNPACK runs them in int8 ("Batch Matrix
Multiply (NC, QS8)") when both operands and the result carry fixed per-tensor scales, calibrated on
train-split images. That is faster on CPUs with int8 dot products (x86 VNNI, Arm dotprod); on CPUs
without them the int8 kernel is slower than float32 (docs/benchmarks.md), so a profile for such a
board (a Raspberry Pi 4's Cortex-A72) can keep them in float:
``attention_matmuls = "float32"`` in its ``[artefacts.options]``. The .tflite and .pte exporters
read it here; ONNX int8 QDQ names its quantised ops itself (``op_types_to_quantize``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HydraEdgeError

OPTION = "attention_matmuls"
CHOICES = ("int8", "float32")
DEFAULT = "int8"
# Images whose activations set the attention matmuls' ranges when the rest of the artefact needs
# none (dynamic-range int8); a static scheme uses its own calibration_images for every activation.
CALIBRATION_IMAGES = 16


def attention_matmuls(options: Mapping[str, Any], where: str = "target") -> str:
    """The option's value, checked: "int8" (the default) or "float32"."""
    value = options.get(OPTION, DEFAULT)
    if value not in CHOICES:
        raise HydraEdgeError(f"{where}: option {OPTION} = {value!r}: give \"int8\" (CPUs with int8 dot products) or "
                             "\"float32\" (CPUs without) in the profile's [artefacts.options]")
    return str(value)
