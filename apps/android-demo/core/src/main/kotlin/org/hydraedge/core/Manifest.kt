package org.hydraedge.core

import java.io.File

/** Where a compact bundle keeps an artefact: the recipe that rebuilds it, and the recipe's sha256. */
data class Compact(val recipe: String, val sha256: String)

/** One artefact of the bundle manifest: what the switcher and the rebuild act on. */
data class ManifestArtefact(
    val id: String,
    val heads: Int,
    val format: String,
    val file: String,
    val bytes: Long,
    val sha256: String,
    val threads: Int,
    val runtime: String,
    val compact: Compact?,
)

/**
 * The bundle manifest (`manifest.json`, schema `hydra-edge/bundle` v1), the fields a phone acts on.
 *
 * Every field read here is checked as hydra_edge.records.manifest checks it (types, ranges, paths
 * inside the bundle, no more heads than the model has). The rest of the manifest (model, golden pairs, accuracy) is not read: the app
 * reaches it only through lut.json, whose manifest_sha256 must be the sha256 of this very file
 * ([Lut.read] with a bundle), so it is the manifest convert wrote and checked.
 */
class Manifest(val artefacts: List<ManifestArtefact>) {
    companion object {
        const val FILE = "manifest.json"
        const val SCHEMA = "hydra-edge/bundle"
        const val HINT = "re-run hydra-edge convert into a new folder"
        /** hydra_edge.records.config.ModelConfig's num_heads: what a manifest's model without one has. */
        const val MODEL_NUM_HEADS = 12L

        fun read(bundle: File): Manifest {
            val file = File(bundle, FILE)
            val data = Records.readBytes(file, "manifest", if (file.exists()) HINT else "run hydra-edge convert first") { BundleException(it) }
            return decode(data, file.path)
        }

        fun decode(data: ByteArray, where: String): Manifest {
            val fail: (String, String) -> Nothing = { path, message -> throw BundleException("$where: $path: $message; $HINT", path) }
            val root = Records.header(data, where, "manifest", HINT, SCHEMA, 1) { m, p -> BundleException(m, p) }
            val f = Fields(root, "$", fail)
            val list = if (f.has("artefacts")) f.array("artefacts") else org.json.JSONArray() // absent: none; null is no list
            val artefacts = Checks.list(list, f.at("artefacts"), fail = fail) { v, at ->
                val a = Fields(Checks.obj(v, at, fail), at, fail)
                val compact = a.optObj("compact")?.let { c ->
                    val recipe = c.string("recipe")
                    val sha256 = c.sha256("sha256")
                    c.noOthers()
                    Checks.relativePath(recipe, c.at("recipe"), fail)
                    Compact(recipe, sha256)
                }
                val file = a.string("file")
                Checks.relativePath(file, a.at("file"), fail)
                ManifestArtefact(a.name("id"), a.long("heads", 1, Checks.MAX_HEADS).toInt(), a.literal("format", Lut.FORMATS), file,
                    a.long("bytes", 0, 1L shl 53), a.sha256("sha256"), a.long("threads", 1, 1024).toInt(), a.name("runtime"), compact)
            }
            // schema_version last of the fields, as Python decodes them: the header took 1.0 as 1, the field is an int
            f.long("schema_version", Long.MIN_VALUE, Long.MAX_VALUE)
            // Manifest.__post_init__, in its order: no artefact runs more heads than the model has (the model's
            // own fields are not read here; Python refuses a bad one first), then ids unique
            val numHeads = (root.optJSONObject("model")?.opt("num_heads") as? Long) ?: MODEL_NUM_HEADS
            for ((i, a) in artefacts.withIndex()) if (a.heads > numHeads)
                fail("$.artefacts[$i].heads", "${a.heads} heads, but the model has $numHeads")
            if (artefacts.map { it.id }.toSet().size != artefacts.size) fail("$.artefacts", "two artefacts have the same id")
            return Manifest(artefacts)
        }
    }
}
