"""Conversion: one subnetwork per head count -> a verified artefact per target variant, plus a manifest.

Reads as the pipeline: ``targets`` (what a device wants) -> ``options``, ``inputs``, ``naming`` and
``plan`` (what to make, what a re-run keeps) -> ``references`` (each head count's fp32 logits and its
``nesting`` measurement, once) -> ``<format>`` exporters (``tflite``, ``executorch``, ``onnx``; each one
module satisfying ``formats.Exporter``, heavy imports inside; ``pt2e``, ``attention`` and ``rewrites``
shared by them) -> ``artefact`` (export, ``verify`` in the device's own runtime via
``hydra_edge.runtime.engines``, ``golden`` pair, record; its gates decide on ``evidence``) -> ``pool``
and ``workers`` (parallel) -> ``pipeline`` (incremental, resumable; the manifest is
``hydra_edge.records.manifest``) -> ``layout`` and ``compact`` (one weight set; ``expand`` back to
files). The click command is ``hydra_edge.commands.convert``.
"""
