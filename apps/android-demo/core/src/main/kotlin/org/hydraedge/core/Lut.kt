package org.hydraedge.core

import org.json.JSONArray
import org.json.JSONObject
import java.io.File
import java.security.MessageDigest

/** A Pareto-optimal subnetwork of this device, as lut.json records it (Python's `LutCandidate`). */
data class Candidate(
    val heads: Int,
    val artefact: String,
    val file: String,
    val sha256: String,
    val format: String,
    val threads: Int,
    val latencyMs: Double,
    val accuracy: Double,
    val powerW: Double?,
)

/**
 * What the selection needs from `lut.json`: hydra_edge.runtime.lut.Table, line for line.
 *
 * `cells[b][t]` indexes [candidates] (fastest, fewest heads first). Unknown readings are NaN and
 * pick the worst band; -1 % is "no battery" (mains), not unknown.
 */
class Table(
    val candidates: List<Candidate>,
    val cells: List<IntArray>,
    val thermalSource: String,
    val thermalEdges: DoubleArray,
    val thermalMargin: Double,
    val throttledC: Double?,
    val batteryMinPct: DoubleArray,
    val batteryMarginPct: Double,
    val minDwellS: Double,
    val manifestSha256: String,
    /** NaN for the one-cell fallback table, which has no budget. */
    val budgetMs: Double = Double.NaN,
    val budgetScale: DoubleArray = DoubleArray(0),
    /** sha256 of the bytes read, so nothing reads the file twice; "" when not read from one. */
    val sha256: String = "",
    /** lut.json's thermal.headroom: the target names Android's thermal headroom forecast (false when absent). */
    val thermalHeadroom: Boolean = false,
) {
    val heads: List<Int> = candidates.map { it.heads }

    fun candidate(heads: Int): Candidate = candidates.first { it.heads == heads }

    fun thermalBand(thermal: Double): Int =
        if (thermal.isNaN()) thermalEdges.size else thermalEdges.count { thermal >= it }

    fun batteryBand(batteryPct: Double, charging: Boolean): Int {
        if (batteryPct.isNaN()) return batteryMinPct.size // unknown, unlike -1 (no battery): the worst
        if (charging || batteryPct < 0) return 0
        for (i in batteryMinPct.indices) if (batteryPct >= batteryMinPct[i]) return i + 1
        return batteryMinPct.size
    }

    /** The latency budget now: budget_ms scaled for the battery band. */
    fun budget(batteryPct: Double, charging: Boolean): Double = budgetMs * budgetScale[batteryBand(batteryPct, charging)]

    /** The candidate index for a reading, without hysteresis. */
    fun cell(batteryPct: Double, charging: Boolean, thermal: Double): Int =
        cells[batteryBand(batteryPct, charging)][thermalBand(thermal)]

    /**
     * The head count to run now: a worse-or-equal cell at once; a better one only after
     * min_dwell_s since the last switch, and only as far as it holds with the thermal and battery
     * margins against it. A previous head count that is no candidate (0 at start-up) takes the cell.
     */
    fun select(batteryPct: Double, charging: Boolean, thermal: Double, prevHeads: Int, sinceSwitchS: Double): Int {
        val raw = cell(batteryPct, charging, thermal)
        val prev = heads.indexOf(prevHeads)
        if (prev < 0 || raw <= prev) return candidates[raw].heads
        if (sinceSwitchS < minDwellS) return candidates[prev].heads
        val cautiousPct = if (batteryPct >= 0) Math.max(batteryPct - batteryMarginPct, 0.0) else batteryPct
        val safe = cell(cautiousPct, charging, thermal + thermalMargin)
        return candidates[Math.max(prev, Math.min(raw, safe))].heads
    }

    /** An Android thermal status in the table's unit: NaN (unknown) when there is none. */
    fun androidThermalInput(status: Int?): Double = status?.toDouble() ?: Double.NaN

    companion object {
        /** A one-cell table that always runs [smallest]: what runs when lut.json cannot be used. */
        fun fallback(smallest: ManifestArtefact): Table = Table(
            candidates = listOf(Candidate(smallest.heads, smallest.id, smallest.file, smallest.sha256, smallest.format,
                smallest.threads, Double.NaN, Double.NaN, null)),
            cells = listOf(intArrayOf(0)), thermalSource = "temperature", thermalEdges = DoubleArray(0),
            thermalMargin = 0.0, throttledC = null, batteryMinPct = DoubleArray(0), batteryMarginPct = 0.0,
            minDwellS = 0.0, manifestSha256 = "")
    }
}

/**
 * Reading `lut.json` (schema `hydra-edge/lut` v1) exactly as strictly as hydra_edge.records.lut:
 * every field's type and range, unknown fields refused, and the shape (bands in order, one cell per
 * band pair naming a candidate, candidates fastest first with fewer heads, no cell running more
 * heads than a cooler or fuller neighbour). Each refusal is one [LutException] line whose [path]
 * is the field Python names.
 */
object Lut {
    const val SCHEMA = "hydra-edge/lut"
    const val SCHEMA_VERSION = 1L
    const val HINT = "re-run hydra-edge lut"
    /** The most a record may hold (hydra_edge.records.codec.RECORD_MAX_BYTES): they are KiB. */
    const val RECORD_MAX_BYTES = 8L shl 20
    val FORMATS = listOf("tflite", "executorch", "onnx")
    val ANDROID_THERMAL_STATUSES = listOf("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")

    /** Read `lut.json` once; with [bundle], also check it was built for that bundle's manifest and artefacts. */
    fun read(file: File, bundle: File? = null): Table {
        val data = Records.readBytes(file, "lookup table", HINT) { m -> LutException(m) }
        val table = decode(data, file.path)
        if (bundle != null) checkBundle(table, file, bundle)
        return table
    }

    /** Parse and check lut.json's bytes (`where` names them in messages). */
    fun decode(data: ByteArray, where: String): Table {
        val fail: (String, String) -> Nothing = { path, message ->
            throw LutException("$where: $path: $message; $HINT", path)
        }
        val root = Records.header(data, where, "lookup table", HINT, SCHEMA, SCHEMA_VERSION) { m, p -> LutException(m, p) }
        return document(Fields(root, "$", fail), fail).let { t ->
            Table(t.candidates, t.cells, t.thermalSource, t.thermalEdges, t.thermalMargin, t.throttledC, t.batteryMinPct,
                t.batteryMarginPct, t.minDwellS, t.manifestSha256, t.budgetMs, t.budgetScale, Records.sha256Hex(data),
                t.thermalHeadroom)
        }
    }

    private fun document(f: Fields, fail: (String, String) -> Nothing): Table {
        f.string("created_by")
        val bundle = f.obj("bundle")
        bundle.string("path"); val manifestSha = bundle.sha256("manifest_sha256"); bundle.optString("target"); bundle.noOthers()
        val cal = f.obj("calibration")
        cal.string("path"); cal.sha256("sha256"); cal.string("device_id"); cal.bool("soak"); cal.noOthers()
        val budget = f.double("budget_ms", 0.0, Checks.LARGE, loOpen = true)
        policy(f.obj("policy"), fail)
        f.literal("accuracy_basis", listOf("top1", "heads"))
        val candidates = Checks.list(f.array("candidates"), f.at("candidates"), minLength = 1, fail = fail) { v, at ->
            candidate(Fields(Checks.obj(v, at, fail), at, fail), fail)
        }
        Checks.list(f.array("dominated"), f.at("dominated"), fail = fail) { v, at ->
            val d = Fields(Checks.obj(v, at, fail), at, fail)
            d.long("heads", 1, Checks.MAX_HEADS); d.double("latency_ms", 0.0, Checks.LARGE); d.double("accuracy", 0.0, Checks.LARGE); d.noOthers()
        }
        val thermal = f.obj("thermal")
        val source = thermal.literal("source", listOf("temperature", "android"))
        strings(thermal, "names", fail)
        val edges = Checks.list(thermal.array("edges"), thermal.at("edges"), maxLength = 64, fail = fail) { v, at ->
            Checks.double(v, at, -Checks.LARGE, Checks.LARGE, false, fail)
        }
        val margin = thermal.double("margin", 0.0, 1000.0)
        val throttled = thermal.optDouble("throttled_c", -Checks.LARGE, Checks.LARGE, required = true)
        Checks.list(thermal.array("derating"), thermal.at("derating"), fail = fail) { v, at -> Checks.double(v, at, 0.0, Checks.LARGE, true, fail) }
        Checks.list(thermal.array("derating_basis"), thermal.at("derating_basis"), fail = fail) { v, at -> Checks.literal(v, at, listOf("soak", "default"), fail) }
        val headroom = if (thermal.has("headroom")) thermal.bool("headroom") else false // absent in older tables
        thermal.noOthers()
        if (!Checks.rising(edges)) fail(thermal.at("edges"), "thermal band edges must rise strictly")
        if (headroom && source != "android") fail(thermal.at("headroom"), "thermal headroom is an Android forecast; it needs source \"android\"")
        val battery = f.obj("battery")
        strings(battery, "names", fail)
        val minPct = Checks.list(battery.array("min_pct"), battery.at("min_pct"), maxLength = 100, fail = fail) { v, at ->
            Checks.double(v, at, 0.0, 100.0, false, fail)
        }
        val marginPct = battery.double("margin_pct", 0.0, 100.0)
        val scales = Checks.list(battery.array("budget_scale"), battery.at("budget_scale"), fail = fail) { v, at -> Checks.double(v, at, 0.0, Checks.LARGE, true, fail) }
        Checks.list(battery.array("max_energy_mj"), battery.at("max_energy_mj"), fail = fail) { v, at ->
            if (v == JSONObject.NULL) null else Checks.double(v, at, 0.0, Checks.LARGE, true, fail)
        }
        battery.noOthers()
        if (!Checks.rising(minPct.reversed())) fail(battery.at("min_pct"), "battery band edges must fall strictly")
        val sel = f.obj("selection")
        val cells = Checks.list(sel.array("cells"), sel.at("cells"), fail = fail) { row, at ->
            Checks.list(Checks.array(row, at, fail), at, fail = fail) { v, a -> Checks.long(v, a, 0, 1L shl 53, fail) }
        }
        val dwell = sel.double("min_dwell_s", 0.0, 1e6)
        Checks.list(sel.array("expected_ms"), sel.at("expected_ms"), fail = fail) { row, at ->
            Checks.list(Checks.array(row, at, fail), at, fail = fail) { v, a -> Checks.double(v, a, 0.0, Checks.LARGE, false, fail) }
        }
        Checks.list(sel.array("meets_budget"), sel.at("meets_budget"), fail = fail) { row, at ->
            Checks.list(Checks.array(row, at, fail), at, fail = fail) { v, a -> Checks.bool(v, a, fail) }
        }
        sel.noOthers()
        val classes = f.optArray("classes")?.let { a ->
            Checks.list(a, f.at("classes"), maxLength = 1 shl 24, minLength = 1, fail = fail) { v, at -> Checks.name(v, at, fail) }
        }
        f.string("schema"); f.long("schema_version", Long.MIN_VALUE, Long.MAX_VALUE)
        f.noOthers()

        // LutDocument.__post_init__: the shape, in Python's order
        val heads = candidates.map { it.heads }
        if (heads.toSet().size != heads.size) fail("$.candidates", "two candidates have the same head count")
        val latencies = candidates.map { it.latencyMs }
        if ((0 until latencies.size - 1).any { latencies[it] > latencies[it + 1] }) fail("$.candidates", "candidates must be ordered fastest first")
        for (i in 0 until heads.size - 1) if (heads[i] > heads[i + 1])
            fail("$.candidates[$i].heads", "${heads[i]} heads, more than the slower candidates[${i + 1}] (${heads[i + 1]} heads); a faster candidate must run fewer heads")
        val rows = minPct.size + 1
        val columns = edges.size + 1
        if (scales.size != rows) fail("$.battery.budget_scale", "${scales.size} scales for $rows battery bands")
        if (cells.size != rows || cells.any { it.size != columns })
            fail("$.selection.cells", "needs $rows rows (battery bands) of $columns cells (thermal bands)")
        for ((b, row) in cells.withIndex()) for ((t, i) in row.withIndex()) if (i >= candidates.size)
            fail("$.selection.cells[$b][$t]", "$i names no candidate (there are ${candidates.size})")
        neverMoreHeads(cells.map { r -> r.map { it.toInt() } }, heads, fail)
        if (classes != null) {
            val first = HashMap<String, Int>()
            for ((i, n) in classes.withIndex()) {
                val before = first[n]
                if (before != null) fail("$.classes", "class name '$n' appears twice (classes $before and $i)")
                first[n] = i
            }
        }
        return Table(candidates, cells.map { r -> r.map { it.toInt() }.toIntArray() }, source, edges.toDoubleArray(), margin,
            throttled, minPct.toDoubleArray(), marginPct, dwell, manifestSha, budget, scales.toDoubleArray(), thermalHeadroom = headroom)
    }

    /** Refuse a cell running more heads than the cell one thermal band cooler or one battery band fuller. */
    private fun neverMoreHeads(cells: List<List<Int>>, heads: List<Int>, fail: (String, String) -> Nothing) {
        for ((b, row) in cells.withIndex()) for ((t, i) in row.withIndex()) {
            for ((n, says) in listOf(Pair(b, t - 1) to "a hotter band", Pair(b - 1, t) to "a lower battery band")) {
                val (nb, nt) = n
                if (nb >= 0 && nt >= 0 && heads[i] > heads[cells[nb][nt]])
                    fail("$.selection.cells[$b][$t]", "${heads[i]} heads in $says than cells[$nb][$nt] (${heads[cells[nb][nt]]} heads); " +
                        "head counts must not rise with temperature or fall with battery")
            }
        }
    }

    private fun strings(f: Fields, key: String, fail: (String, String) -> Nothing): List<String> =
        Checks.list(f.array(key), f.at(key), fail = fail) { v, at -> Checks.string(v, at, fail) }

    private fun candidate(c: Fields, fail: (String, String) -> Nothing): Candidate {
        val heads = c.long("heads", 1, Checks.MAX_HEADS).toInt()
        val artefact = c.name("artefact")
        val file = c.string("file")
        val sha = c.sha256("sha256")
        val format = c.literal("format", FORMATS)
        val threads = c.long("threads", 1, 1024).toInt()
        val latency = c.double("latency_ms", 0.0, Checks.LARGE)
        val accuracy = c.double("accuracy", 0.0, Checks.LARGE)
        val power = c.optDouble("power_w", 0.0, Checks.LARGE)
        c.noOthers()
        Checks.relativePath(file, c.at("file"), fail)
        return Candidate(heads, artefact, file, sha, format, threads, latency, accuracy, power)
    }

    /** hydra_edge.records.policy.Policy: every key optional (its default), each checked when given. */
    private fun policy(p: Fields, fail: (String, String) -> Nothing) {
        p.optDouble("budget_ms", 0.0, Checks.LARGE, loOpen = true)
        if (p.has("min_dwell_s")) p.double("min_dwell_s", 0.0, 1e6)
        p.objIfGiven("thermal")?.let { t ->
            if (t.has("source")) t.literal("source", listOf("auto", "temperature", "android"))
            val edges = if (t.has("edges_c")) Checks.list(t.array("edges_c"), t.at("edges_c"), 64, 1, fail) { v, at -> Checks.double(v, at, -273.15, 1000.0, false, fail) }
                else listOf(60.0, 70.0, 80.0)
            if (t.has("margin_c")) t.double("margin_c", 0.0, 1000.0)
            val derating = if (t.has("derating")) Checks.list(t.array("derating"), t.at("derating"), fail = fail) { v, at -> Checks.double(v, at, 1.0, 1000.0, false, fail) }
                else listOf(1.0, 1.15, 1.4, 2.0)
            t.optDouble("throttled_c", -273.15, 1000.0)
            val android = if (t.has("android_derating")) Checks.list(t.array("android_derating"), t.at("android_derating"), fail = fail) { v, at -> Checks.double(v, at, 1.0, 1000.0, false, fail) }
                else List(7) { 1.0 }
            t.noOthers()
            if (!Checks.rising(edges)) fail(t.at("edges_c"), "must be one or more strictly rising °C, e.g. [60, 70, 80]")
            if (derating.size != edges.size + 1) fail(t.at("derating"), "needs one multiplier per band (${edges.size + 1})")
            if (android.size != ANDROID_THERMAL_STATUSES.size) fail(t.at("android_derating"), "needs ${ANDROID_THERMAL_STATUSES.size} multipliers (NONE..SHUTDOWN)")
        }
        p.objIfGiven("battery")?.let { b ->
            if (b.has("margin_pct")) b.double("margin_pct", 0.0, 100.0)
            if (b.has("charging_budget_scale")) b.double("charging_budget_scale", 0.0, Checks.LARGE, loOpen = true)
            val mins = if (b.has("bands")) Checks.list(b.array("bands"), b.at("bands"), 100, 1, fail) { v, at ->
                val band = Fields(Checks.obj(v, at, fail), at, fail)
                val m = band.double("min_pct", 0.0, 100.0)
                band.double("budget_scale", 0.0, Checks.LARGE, loOpen = true)
                band.optDouble("max_energy_mj", 0.0, Checks.LARGE, loOpen = true)
                band.noOthers()
                m
            } else listOf(50.0, 20.0, 0.0)
            b.noOthers()
            if (!Checks.rising(mins.reversed()) || mins[mins.size - 1].toDouble() != 0.0)
                fail(b.at("bands"), "must fall strictly by min_pct and end at min_pct = 0")
        }
        p.noOthers()
    }

    /** read_table's bundle check: built for this manifest, banded on the thermal status (all a phone reads), naming only its artefacts as it records them. */
    private fun checkBundle(table: Table, file: File, bundle: File) {
        val manifestFile = File(bundle, Manifest.FILE)
        val actual = if (manifestFile.isFile) Records.sha256Hex(manifestFile.readBytes()) else null
        if (actual != table.manifestSha256)
            throw LutException("${file.path} was built for another bundle (manifest sha256 ${table.manifestSha256.take(12)}, " +
                "${manifestFile.path} has ${actual?.take(12)}); re-run hydra-edge lut")
        // The phone passes its thermal status to the table whatever the table's source (Switcher.kt): a table
        // banded in °C would read SHUTDOWN (6) as 6 °C, the coolest band. hydra_edge.runtime.lut.thermal_source_problem.
        if (table.thermalSource != "android")
            throw LutException("${file.path}: $.thermal.source: '${table.thermalSource}' bands the table in °C, but the phone reads " +
                "the Android thermal status (0 NONE .. 6 SHUTDOWN); set the policy's [thermal] source = 'android' (or \"auto\") " +
                "and re-run hydra-edge lut", "$.thermal.source")
        val artefacts = Manifest.read(bundle).artefacts.associateBy { it.id }
        for ((i, c) in table.candidates.withIndex()) {
            val a = artefacts[c.artefact]
                ?: throw LutException("${file.path}: $.candidates[$i].artefact: '${c.artefact}' is not an artefact of ${manifestFile.path}; re-run hydra-edge lut")
            for ((field, mine, theirs) in listOf(Triple("heads", c.heads, a.heads), Triple("file", c.file, a.file),
                    Triple("sha256", c.sha256, a.sha256), Triple("format", c.format, a.format), Triple("threads", c.threads, a.threads)))
                if (mine != theirs) throw LutException("${file.path}: $.candidates[$i].$field: '$mine', but ${manifestFile.path} has " +
                    "'$theirs' for ${c.artefact}; re-run hydra-edge lut")
        }
    }
}

/** What every record reader shares (hydra_edge.records.codec): bounded reads, the header first, hashes. */
object Records {
    fun sha256Hex(data: ByteArray): String =
        MessageDigest.getInstance("SHA-256").digest(data).joinToString("") { "%02x".format(it) }

    /** A regular file's bytes, at most [max]; one line otherwise (a folder or a FIFO is refused, not waited on). */
    fun readBytes(file: File, what: String, hint: String, max: Long = Lut.RECORD_MAX_BYTES,
                  error: (String) -> RecordException): ByteArray {
        if (!file.exists()) throw error("no $what at ${file.path}; $hint")
        if (!file.isFile) throw error("cannot read $what: ${file.path} is not a regular file; $hint")
        if (file.length() > max) throw error("cannot read $what: ${file.path} is larger than $max bytes; $hint")
        try {
            file.inputStream().use { input ->
                val out = java.io.ByteArrayOutputStream()
                val buf = ByteArray(1 shl 16)
                var total = 0L
                while (true) {
                    val n = input.read(buf)
                    if (n < 0) break
                    total += n
                    if (total > max) throw error("cannot read $what: ${file.path} is larger than $max bytes; $hint")
                    out.write(buf, 0, n)
                }
                return out.toByteArray()
            }
        } catch (e: java.io.IOException) {
            throw error("cannot read $what ${file.path}: ${e.message}; $hint")
        }
    }

    /** The document as an object after its schema and version are checked, as codec.decode does first. */
    fun header(data: ByteArray, where: String, what: String, hint: String, schema: String, version: Long,
               error: (String, String) -> RecordException): JSONObject {
        val root = try {
            StrictJson.parse(StrictJson.utf8(data))
        } catch (e: StrictJson.SyntaxError) {
            val at = e.path
            throw if (at != null) error("$where: $at: ${e.message}; $hint", at) else error("$where: not valid JSON (${e.message}); $hint", "$")
        }
        if (root !is JSONObject) throw error("$where: $: expected `object`; $hint", "$")
        val got = root.opt("schema")
        if (got != schema) throw error("$where: $.schema: not a hydra-edge $what (schema ${got ?: "None"}, expected '$schema'); $hint", "$.schema")
        val v = root.opt("schema_version")
        val isVersion = (v is Long && v == version) || (v is Double && v == version.toDouble()) || (v == true && version == 1L)
        if (!isVersion) throw error("$where: $.schema_version: $what schema version $v, this hydra-edge reads version $version; $hint", "$.schema_version")
        return root
    }
}
