"""Every file hydra-edge writes or reads, as one declarative schema per record (msgspec).

Host and device import the same schemas, so a writer can only write what a reader accepts and a
reader checks every field's type and range where the file is read. Standard library and msgspec
only, Python 3.9+: boards import this package.

* ``codec``: the one decode/encode path; a bad file is one ``HydraEdgeError`` line naming the
  file, the field (``$.artefacts[2].heads``), what was expected and how to fix it.
* ``fields``: constrained field types shared by the records (head counts, sha256, finite
  numbers, paths that stay inside their bundle).
* one module per record: ``manifest`` (bundle manifest.json), ``config`` (the model config it
  carries), ``target`` (target profile TOML), ``calibration`` (calibration JSON), ``policy``
  (lookup-table policy TOML), ``lut`` (lut.json), ``recipe`` (how a compact bundle rebuilds an
  artefact), ``training`` (the training state a checkpoint carries for ``train --resume``).
"""
