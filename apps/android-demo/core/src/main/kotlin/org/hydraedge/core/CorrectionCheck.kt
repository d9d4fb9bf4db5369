package org.hydraedge.core

import org.json.JSONArray
import org.json.JSONObject
import java.io.File

/**
 * `CorrectionCheck read <file>...`: each latency correction as [Correction.read] reads it, one JSON line
 * (its fields, or `{"refused": true, "path", "message"}`). `CorrectionCheck write <spec.json> <file>`:
 * the document the spec gives (the record's own field names), encoded by [Correction.encode] and written
 * by [Correction.writeAtomically], as the app saves what its latency loop learned. The rebuild test
 * passes corrections between this and Python's reader and writer, both ways.
 */
object CorrectionCheck {
    @JvmStatic
    fun main(args: Array<String>) {
        require(args.size >= 2 && args[0] in setOf("read", "write")) { "usage: CorrectionCheck read <file>... | write <spec.json> <file>" }
        if (args[0] == "write") {
            val spec = JSONObject(File(args[1]).readText())
            val learned = spec.getJSONArray("learned")
            val doc = CorrectionDocument(spec.getString("created_by"), spec.getDouble("saved_at"), spec.getString("manifest_sha256"),
                spec.getString("lut_sha256"), spec.getDouble("budget_ms"), (0 until learned.length()).map { i ->
                    val e = learned.getJSONObject(i)
                    LearnedLatency(e.getInt("heads"), e.getDouble("p90_ms"), e.getDouble("slowdown"), e.getLong("samples"))
                })
            val file = File(args[2])
            Correction.writeAtomically(file, Correction.encode(doc, file.path))
            return
        }
        val out = StringBuilder()
        for (name in args.drop(1)) {
            val line = try {
                val d = Correction.read(File(name))
                JSONObject().put("refused", false).put("created_by", d.createdBy).put("saved_at", d.savedAt)
                    .put("manifest_sha256", d.manifestSha256).put("lut_sha256", d.lutSha256).put("budget_ms", d.budgetMs)
                    .put("learned", JSONArray(d.learned.map {
                        JSONObject().put("heads", it.heads).put("p90_ms", it.p90Ms).put("slowdown", it.slowdown).put("samples", it.samples)
                    }))
            } catch (e: CorrectionException) {
                JSONObject().put("refused", true).put("path", e.path ?: JSONObject.NULL).put("message", e.message)
            }
            out.append(line).append('\n')
        }
        System.out.write(out.toString().toByteArray(Charsets.UTF_8)) // UTF-8 whatever the locale
        System.out.flush()
    }
}
