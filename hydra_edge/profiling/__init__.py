"""Host-side measurement helpers that the bench scripts (``bench/``) and the tests share.

- ``litert``, ``executorch``, ``onnxruntime``: each runtime's own op profiler, summed by op type
  (``op_times``): where an artefact's time goes;
- ``timing``: single inferences timed interleaved once the previous run's threads are idle
  (``paired_ms``), and what the host is (``host_cpu``, ``cpu_family``);
- ``recipes``: the artefacts' int8 recipes applied to any module (``export_with_recipe``), a batch
  stacked along channels (``Stacked``);
- ``bundles``: a full bundle of random weights and its compacted copy (``full_and_compact``);
- ``report``: how every bench ends, ``<name>.json``, ``.md`` and ``.png`` and the table printed.
- ``arguments``: the command-line values the int8 benches share (``positive_list``, ``fc_shape``).

Nothing here is imported by the rest of ``hydra_edge``; the runtimes and matplotlib are imported
inside the functions that use them.
"""
