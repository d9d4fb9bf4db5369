package org.hydraedge.core

import org.json.JSONArray
import org.json.JSONException
import org.json.JSONObject
import java.io.File

/**
 * Replays a shared trace (the parity test's scripted phone) through this library and prints, per
 * poll and per inference, the head count and the reason of the switch it made (null: none) as JSON
 * lines. tests/test_android_parity.py runs the same trace through Python's own switcher and
 * compares the two line by line; this is the harness, not the logic, so it only mirrors the
 * Python side's fake clock, fake timer and fake phone.
 *
 * Usage: `java -cp <jar:deps> org.hydraedge.core.TraceReplay trace.json bundle-folder`, or
 * `TraceReplay --batch list.tsv` for many traces in one JVM (the generated traces: thousands): each line of
 * the list is `trace.json<TAB>bundle-folder`, and each trace's result is one JSON line, `{"out": [...]}`
 * or, when the library threw (which it never may), `{"error": "..."}`.
 */
object TraceReplay {
    private class State(trace: JSONObject, val bundle: File) {
        var clock = trace.optDouble("clock", 1000.0)
        var wall = trace.optDouble("wall", 1.75e9)
        val signals = trace.optJSONObject("signals") ?: JSONObject()
        val loop = trace.optJSONObject("loop")
        val out = JSONArray()
        /** The phone's reading now: what the last poll read, which an inference's own first poll reads too. */
        var reading = AndroidReading(null, Double.NaN, null, null)
        var sw: Switcher = open()

        fun open(): Switcher = Switcher.open(
            bundle,
            SignalSettings(signals.optDouble("stale_after_s", 30.0), signals.optDouble("raise_after_s", 10.0),
                if (signals.isNull("assumed_hot")) null else signals.getDouble("assumed_hot"), signals.optBoolean("headroom", true)),
            clock = { clock },
            loop = loop?.let { settings(it) },
            wallClock = { wall })

        fun emit(op: String, heads: Int?, before: Int) {
            val reason = if (sw.events.size > before) sw.events.last().reason else null
            out.put(JSONObject().put("op", op).put("heads", heads ?: JSONObject.NULL).put("reason", reason ?: JSONObject.NULL))
        }
    }

    private fun settings(o: JSONObject) = LoopSettings(
        budgetMs = if (o.has("budget_ms")) o.getDouble("budget_ms") else null,
        windowS = o.optDouble("window_s", 5.0), sustainS = o.optDouble("sustain_s", 10.0), dwellS = o.optDouble("dwell_s", 30.0),
        probeInferences = o.optInt("probe_inferences", 20), maxSwitchesPerMinute = o.optInt("max_switches_per_minute", 4),
        minSamples = o.optInt("min_samples", 5), maxSamples = o.optInt("max_samples", 256),
        absurdMs = o.optDouble("absurd_ms", 60_000.0), expireS = o.optDouble("expire_s", 3600.0))

    /**
     * The phone's reading a trace step scripts: null fields are unreadable signals; a headroom that is null
     * (the board's command fails) or "nan" (it prints NaN) is what getThermalHeadroom gives then, NaN.
     */
    fun reading(o: JSONObject) = AndroidReading(
        thermalStatus = if (o.isNull("status")) null else o.getInt("status"),
        thermalHeadroom = if (o.isNull("headroom")) Double.NaN else latency(o.get("headroom")),
        batteryLevel = if (o.isNull("level")) null else o.getInt("level"),
        batteryStatus = if (o.isNull("battery_status")) null else o.getInt("battery_status"))

    /** A scripted number: a number, or "nan", "inf", "-inf" (JSON has no spelling for them). */
    private fun latency(v: Any): Double = when (v) {
        is String -> when (v) { "nan" -> Double.NaN; "inf" -> Double.POSITIVE_INFINITY; "-inf" -> Double.NEGATIVE_INFINITY; else -> v.toDouble() }
        is Number -> v.toDouble()
        else -> throw IllegalArgumentException("latency $v")
    }

    /**
     * One timed single-image inference of the running head count, as the Python harness's fake timer times it;
     * before the first poll it polls the phone's reading now first, as Python's predict() does, and reports
     * that start switch as the inference's.
     */
    private fun infer(s: State, ms: Double, advance: Boolean) {
        val before = s.sw.events.size
        val heads = s.sw.heads ?: s.sw.poll(s.reading)
        val elapsedS = ms / 1e3 - 0.0
        if (advance) s.clock += ms / 1e3
        s.sw.observe(heads, elapsedS * 1e3)
        s.emit("infer", s.sw.heads, before)
    }

    /**
     * Spoil the saved correction as the Python harness does: an edit needs a correction there to edit (a JSON
     * object with something learned), a folder put in its place stays until "delete".
     */
    private fun spoil(s: State, how: String) {
        val path = s.sw.loop?.path ?: Correction.pathFor(File(s.bundle, "lut.json"))
        if (path.isDirectory) {
            if (how == "delete") path.delete()
            return
        }
        val text = if (path.isFile) path.readText() else ""
        fun edit(change: (JSONObject) -> Unit) {
            val doc = try { JSONObject(text) } catch (e: JSONException) { return }
            if ((doc.optJSONArray("learned")?.length() ?: 0) == 0) return
            change(doc)
            path.writeText(doc.toString())
        }
        when (how) {
            "damaged" -> path.writeText("{not json")
            "truncated" -> path.writeText(text.substring(0, text.length / 2))
            "foreign_lut" -> edit { it.put("lut_sha256", "0".repeat(64)) }
            "foreign_manifest" -> edit { it.put("manifest_sha256", "f".repeat(64)) }
            "future" -> edit { it.put("saved_at", s.wall + 60) }
            "unknown_heads" -> edit { it.getJSONArray("learned").getJSONObject(0).put("heads", 7) }
            "negative_p90" -> edit { it.getJSONArray("learned").getJSONObject(0).put("p90_ms", -1.0) }
            "unknown_field" -> edit { it.put("extra", 1) }
            "folder" -> { path.delete(); path.mkdir() }
            "delete" -> path.delete()
            else -> throw IllegalArgumentException("spoil $how")
        }
    }

    private fun run(s: State, steps: JSONArray) {
        for (i in 0 until steps.length()) {
            val step = steps.getJSONObject(i)
            if (step.has("t")) s.clock = step.getDouble("t")
            if (step.has("dt")) s.clock += step.getDouble("dt")
            if (step.has("wall_dt")) s.wall += step.getDouble("wall_dt")
            when {
                step.has("repeat") -> repeat(step.getInt("repeat")) { run(s, step.getJSONArray("steps")) }
                step.has("poll") -> poll(s, reading(step.getJSONObject("poll")))
                step.has("infer") -> infer(s, latency(step.get("infer")), advance = false)
                step.has("serve") -> serve(s, step.getJSONObject("serve"))
                step.has("restart") -> { s.sw = s.open(); s.emit("restart", null, s.sw.events.size) }
                step.has("spoil_correction") -> spoil(s, step.getString("spoil_correction"))
            }
        }
    }

    /** Inferences at rate_hz, each taking its head count's calibrated time x factor, and a poll every poll_every_s. */
    private fun serve(s: State, o: JSONObject) {
        val reading = reading(o.getJSONObject("reading"))
        val rate = o.optDouble("rate_hz", 10.0)
        val every = o.optDouble("poll_every_s", 1.0)
        val factor = o.optDouble("factor", 1.0)
        val ms = o.optJSONObject("ms")
        val end = s.clock + o.getDouble("seconds")
        var nextPoll = s.clock
        while (s.clock < end) {
            if (s.clock >= nextPoll) {
                poll(s, reading)
                nextPoll += every
            }
            val frame = s.clock
            val heads = s.sw.heads!!
            val took = if (ms != null && ms.has(heads.toString())) ms.getDouble(heads.toString()) else s.sw.table.candidate(heads).latencyMs * factor
            infer(s, took, advance = true)
            s.clock = Math.max(s.clock, frame + 1.0 / rate)
        }
    }

    private fun poll(s: State, reading: AndroidReading) {
        s.reading = reading
        val before = s.sw.events.size
        val heads = s.sw.poll(reading)
        s.emit("poll", heads, before)
    }

    /** The trace's lines, each poll's and inference's head count and switch reason. */
    private fun replay(trace: File, bundle: File): JSONArray {
        val doc = JSONObject(trace.readText())
        val s = State(doc, bundle)
        run(s, doc.getJSONArray("steps"))
        return s.out
    }

    @JvmStatic
    fun main(args: Array<String>) {
        val out = StringBuilder()
        if (args.size == 2 && args[0] == "--batch") {
            // a plain reader loop: the stdlib's readLines reaches an invoke-custom, which an APK's DEX may not hold
            val listing = File(args[1]).bufferedReader()
            while (true) {
                val line = listing.readLine() ?: break
                if (line.isEmpty()) continue
                val tab = line.indexOf('\t')
                val result = try {
                    JSONObject().put("out", replay(File(line.substring(0, tab)), File(line.substring(tab + 1))))
                } catch (e: Exception) {
                    JSONObject().put("error", e.toString())
                }
                out.append(result).append('\n')
            }
            listing.close()
        } else {
            require(args.size == 2) { "usage: TraceReplay trace.json bundle-folder | TraceReplay --batch list.tsv" }
            val lines = replay(File(args[0]), File(args[1]))
            for (i in 0 until lines.length()) out.append(lines.getJSONObject(i)).append('\n')
        }
        System.out.print(out)
        System.out.flush()
    }
}
