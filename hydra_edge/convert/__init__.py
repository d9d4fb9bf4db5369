"""Conversion: one subnetwork per head count -> a verified artefact per target variant, plus a manifest.

Reads as the pipeline: ``targets`` (what a device wants) -> ``<format>`` exporters (``tflite``,
``executorch``, ``onnx``; each one module satisfying ``formats.Exporter``, heavy imports inside)
-> ``verify`` (run in the device's own runtime via ``hydra_edge.runtime.engines``) -> ``manifest``
(versioned, atomic) -> ``pipeline`` (incremental, resumable, parallel; its stages in ``options``,
``inputs``, ``naming``, ``plan``, ``references``, ``artefact`` and ``pool``) -> the click command.
"""
