"""The bundle's manifest, for the converter: the schema is ``hydra_edge.records.manifest``.

Readers (the calibrator, the lookup table, the switcher) take ``read_manifest`` and get
``Manifest`` / ``ArtefactRecord`` records checked field by field; they never parse the JSON
themselves. The file is always a complete, valid manifest: it is replaced whole, never appended to.
"""

from ..atomic import sha256_file
from ..records.manifest import (MANIFEST, SCHEMA, SCHEMA_VERSION, ArtefactRecord, Manifest, bundle_files, intact,
                                read_manifest)

__all__ = ["MANIFEST", "SCHEMA", "SCHEMA_VERSION", "ArtefactRecord", "Manifest", "bundle_files", "intact",
           "read_manifest", "sha256_file"]
