package org.hydraedge.core

import org.json.JSONObject
import java.io.File

/**
 * `RebuildCheck <bundle> <out folder> [heads...]`: reads the bundle's manifest and gives each artefact's
 * bytes as [Rebuild.artefactBytes] gives them to an app (every artefact, or those with the head counts
 * named), one JSON line each: `{"id", "heads", "compact", "refused", "sha256" | "message"}`. The bytes of
 * each artefact that passed are written to `<out folder>/<id>.bin`; a refused one writes nothing. A
 * manifest that cannot be read is one line `{"manifest": "refused", "message"}`. The rebuild test feeds
 * it the bundles (and their tampered copies) Python rebuilds and compares.
 */
object RebuildCheck {
    @JvmStatic
    fun main(args: Array<String>) {
        require(args.size >= 2) { "usage: RebuildCheck <bundle> <out folder> [heads...]" }
        val bundle = File(args[0])
        val out = File(args[1])
        val wanted = args.drop(2).map { it.toInt() }.toSet()
        val manifest = try {
            Manifest.read(bundle)
        } catch (e: BundleException) {
            System.out.write((JSONObject().put("manifest", "refused").put("message", e.message).toString() + "\n").toByteArray(Charsets.UTF_8))
            System.out.flush()
            return
        }
        val lines = StringBuilder()
        for (record in manifest.artefacts) {
            if (wanted.isNotEmpty() && record.heads !in wanted) continue
            val line = JSONObject().put("id", record.id).put("heads", record.heads).put("compact", record.compact != null)
            try {
                val data = Rebuild.artefactBytes(bundle, record)
                out.mkdirs()
                File(out, "${record.id}.bin").writeBytes(data)
                line.put("refused", false).put("sha256", Rebuild.sha256Hex(data))
            } catch (e: BundleException) {
                line.put("refused", true).put("message", e.message)
            }
            lines.append(line).append('\n')
        }
        System.out.write(lines.toString().toByteArray(Charsets.UTF_8)) // UTF-8 whatever the locale
        System.out.flush()
    }
}
