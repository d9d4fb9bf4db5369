package org.hydraedge.core

import org.json.JSONObject
import java.io.File
import java.io.FileOutputStream
import java.io.IOException

/** The latency correction record (`lut.correction.json`, schema `hydra-edge/latency-correction` v1). */
data class CorrectionDocument(
    val createdBy: String,
    val savedAt: Double,
    val manifestSha256: String,
    val lutSha256: String,
    val budgetMs: Double,
    val learned: List<LearnedLatency>,
)

/**
 * Reading and writing the correction as hydra_edge.records.correction and runtime.closed_loop do:
 * every field checked (a damaged record is refused), and written atomically (a temporary file
 * beside it, flushed to disk, then renamed over it) so a power cut leaves the old file or the new.
 */
object Correction {
    const val SCHEMA = "hydra-edge/latency-correction"
    const val HINT = "the switcher ignores it (running the table's head counts) and learns again; delete it to silence this"
    const val CREATED_BY = "hydra-edge-android-core 0.1.0"

    /** lut.json -> lut.correction.json, beside it. */
    fun pathFor(lut: File): File = File(lut.absoluteFile.parentFile, lut.name.substringBeforeLast('.', lut.name) + ".correction.json")

    fun read(file: File): CorrectionDocument =
        decode(Records.readBytes(file, "latency correction", HINT) { CorrectionException(it) }, file.path)

    fun decode(data: ByteArray, where: String): CorrectionDocument {
        val fail: (String, String) -> Nothing = { path, message -> throw CorrectionException("$where: $path: $message; $HINT", path) }
        val root = Records.header(data, where, "latency correction", HINT, SCHEMA, 1) { m, p -> CorrectionException(m, p) }
        val f = Fields(root, "$", fail)
        val createdBy = f.string("created_by")
        val savedAt = f.double("saved_at", 0.0, Checks.LARGE)
        val manifest = f.sha256("manifest_sha256")
        val lut = f.sha256("lut_sha256")
        val budget = f.double("budget_ms", 0.0, Checks.LARGE, loOpen = true)
        val learned = Checks.list(f.array("learned"), f.at("learned"), maxLength = Checks.MAX_HEADS.toInt(), fail = fail) { v, at ->
            val e = Fields(Checks.obj(v, at, fail), at, fail)
            val l = LearnedLatency(e.long("heads", 1, Checks.MAX_HEADS).toInt(), e.double("p90_ms", 0.0, Checks.LARGE),
                e.double("slowdown", 0.0, Checks.LARGE), e.long("samples", 1, 1L shl 40))
            e.noOthers()
            l
        }
        f.string("schema"); f.long("schema_version", Long.MIN_VALUE, Long.MAX_VALUE)
        f.noOthers()
        if (learned.map { it.heads }.toSet().size != learned.size) fail("$.learned", "two entries for the same head count")
        return CorrectionDocument(createdBy, savedAt, manifest, lut, budget, learned)
    }

    /** The record's bytes, header first, indented as Python writes it; refused if its reader would refuse it. */
    fun encode(doc: CorrectionDocument, where: String): ByteArray {
        val sb = StringBuilder()
        sb.append("{\n  \"schema\": ").append(JSONObject.quote(SCHEMA)).append(",\n  \"schema_version\": 1,\n")
        sb.append("  \"created_by\": ").append(JSONObject.quote(doc.createdBy)).append(",\n")
        sb.append("  \"saved_at\": ").append(num(doc.savedAt)).append(",\n")
        sb.append("  \"manifest_sha256\": ").append(JSONObject.quote(doc.manifestSha256)).append(",\n")
        sb.append("  \"lut_sha256\": ").append(JSONObject.quote(doc.lutSha256)).append(",\n")
        sb.append("  \"budget_ms\": ").append(num(doc.budgetMs)).append(",\n")
        sb.append("  \"learned\": [")
        doc.learned.forEachIndexed { i, e ->
            sb.append(if (i == 0) "\n" else ",\n")
            sb.append("    {\n      \"heads\": ").append(e.heads).append(",\n      \"p90_ms\": ").append(num(e.p90Ms))
                .append(",\n      \"slowdown\": ").append(num(e.slowdown)).append(",\n      \"samples\": ").append(e.samples).append("\n    }")
        }
        sb.append(if (doc.learned.isEmpty()) "]\n}\n" else "\n  ]\n}\n")
        val data = sb.toString().toByteArray(Charsets.UTF_8)
        decode(data, where) // never write what would not read back (NaN, out of range)
        return data
    }

    /** A double as JSON: NaN and infinities have no JSON spelling (encode then refuses the record). */
    private fun num(x: Double): String = if (x.isNaN() || x.isInfinite()) "NaN" else x.toString().replace("E", "e")

    /** Write [data] to [file] atomically: a temporary file beside it, synced, renamed over it. */
    fun writeAtomically(file: File, data: ByteArray) {
        if (file.isDirectory) throw IOException("${file.path} is a folder, where an output file goes")
        val dir = file.absoluteFile.parentFile
        dir.mkdirs()
        val tmp = File.createTempFile(".${file.name}.", ".tmp", dir)
        try {
            FileOutputStream(tmp).use { out ->
                out.write(data)
                out.fd.sync() // on a phone's flash a power cut must not leave a renamed, empty file
            }
            if (!tmp.renameTo(file)) throw IOException("cannot rename ${tmp.path} over ${file.path}")
        } finally {
            if (tmp.exists()) tmp.delete()
        }
    }
}

/**
 * The governor fed by lut.json's budget, and what it learns saved beside lut.json
 * (hydra_edge.runtime.closed_loop.LatencyLoop). A saved correction is used only when it was learned
 * against this bundle and this table (their sha256), is dated no later than now and no older than
 * expireS, and names only head counts of the table; anything else is one warning and the table's
 * head counts run, never more. A wall clock before 1970 or no number (a phone whose clock was never
 * set) dates nothing: a failed read of the clock, one warning, and while it lasts nothing is restored
 * nor written.
 */
class LatencyLoop(
    lutFile: File,
    val table: Table,
    val settings: LoopSettings,
    private val wallClock: () -> Double,
    private val log: Logger,
) {
    val path: File = Correction.pathFor(lutFile)
    val budgetMs: Double
    var budgetNow: Double
        private set
    val governor: LatencyGovernor
    private var savedRevision = 0
    private var writeFailed = false
    private var clockFailed = false

    init {
        if (table.sha256.isEmpty()) throw LutException("${lutFile.path}: the switcher runs no table read from it; re-run hydra-edge lut")
        for ((i, c) in table.candidates.withIndex()) if (!(c.latencyMs > 0))
            throw LutException("${lutFile.path}: $.candidates[$i].latency_ms: ${c.heads} heads calibrated at ${Py.g(c.latencyMs)} ms, " +
                "nothing to scale a slow-down by; re-run hydra-edge calibrate")
        budgetMs = settings.budgetMs ?: table.budgetMs
        budgetNow = budgetMs
        val calibrated = table.candidates.associate { it.heads to it.latencyMs }
        governor = LatencyGovernor(calibrated, settings, log, load(calibrated))
    }

    /** The budget now: budget_ms scaled for the battery band, as the table scales it. */
    fun budget(batteryPct: Double, charging: Boolean): Double {
        budgetNow = budgetMs * table.budgetScale[table.batteryBand(batteryPct, charging)]
        return budgetNow
    }

    private fun load(calibrated: Map<Int, Double>): Pair<Map<Int, LearnedLatency>, Double>? {
        if (!path.exists() && !java.nio.file.Files.isSymbolicLink(path.toPath())) return null
        val doc = try {
            Correction.read(path)
        } catch (e: CorrectionException) {
            log.log("WARNING", e.message ?: "unreadable correction")
            return null
        }
        val now = now() ?: return null
        val age = now - doc.savedAt
        val why = when {
            doc.manifestSha256 != table.manifestSha256 || doc.lutSha256 != table.sha256 ->
                "learned against another bundle or table (lut.json sha256 ${doc.lutSha256.take(12)}, this table's ${table.sha256.take(12)})"
            age < 0 -> "dated ${Py.f(-age, 0)} s in the future (was the clock set back?)"
            doc.learned.any { it.heads !in calibrated } -> "names head counts this table lacks (${doc.learned.map { it.heads }.sorted()})"
            else -> null
        }
        if (why != null) {
            log.log("WARNING", "${path.path}: $why; ${Correction.HINT}")
            return null
        }
        if (age > settings.expireS) {
            log.log("INFO", "${path.path}: saved ${Py.f(age, 0)} s ago, past expire_s (${Py.g(settings.expireS)} s); not used")
            return null
        }
        return doc.learned.associateBy { it.heads } to age
    }

    /** The correction's bytes when the governor has learned something since the last snapshot, else null. */
    fun snapshot(): ByteArray? {
        if (governor.revision == savedRevision) return null
        val now = now() ?: return null // kept unsaved: the next snapshot after the clock is set takes it
        savedRevision = governor.revision
        val doc = CorrectionDocument(Correction.CREATED_BY, now, table.manifestSha256, table.sha256, budgetNow,
            governor.learned.keys.sorted().map { governor.learned.getValue(it) })
        return Correction.encode(doc, path.path)
    }

    /**
     * The wall clock in seconds since the epoch, or null (one warning, the first time) when it reads before
     * 1970 or no number: a correction dated by it could not be aged, nor one saved before it.
     */
    private fun now(): Double? {
        val now = wallClock()
        if (now.isFinite() && now >= 0) return now
        if (!clockFailed) log.log("WARNING", "the wall clock reads ${Py.repr(now)}, before 1970 or no time at all: the latency " +
            "correction ${path.path} is neither restored nor saved until the clock is set")
        clockFailed = true
        return null
    }

    /** Write a snapshot atomically; a failure is one warning (the first only) and inference goes on. */
    fun save(data: ByteArray) {
        try {
            Correction.writeAtomically(path, data)
        } catch (e: IOException) {
            if (!writeFailed) log.log("WARNING", "cannot save the latency correction to ${path.path} (${e.message}); it will be learned again after a restart")
            writeFailed = true
        }
    }
}
