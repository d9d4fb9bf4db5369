package org.hydraedge.core

import java.io.File
import java.util.concurrent.Executor

/**
 * One poll of an Android phone's signals, as the app reads them (no Android classes here, so the
 * library runs and is tested on a plain JVM):
 *
 * * [thermalStatus]: `PowerManager.getCurrentThermalStatus()` (API 29), 0 NONE .. 6 SHUTDOWN; null
 *   when it cannot be read (older API, a failing service).
 * * [thermalHeadroom]: `PowerManager.getThermalHeadroom(10)` (API 30), where 1.0 is the start of severe
 *   throttling; NaN when the phone cannot forecast or is asked again within a second. Where the table and
 *   the settings name headroom, a forecast at or past 1.0 counts as at least SEVERE and one that is NaN,
 *   negative, absurd (outside [HEADROOM_MIN]..[HEADROOM_MAX]) or a denormal float (below
 *   `Float.MIN_NORMAL`: a broken HAL's) is a failed read, as on a board (`cmd thermalservice headroom`);
 *   elsewhere it plays no part.
 * * [batteryLevel]: `BatteryManager.BATTERY_PROPERTY_CAPACITY` in %, null when unreadable
 *   (Integer.MIN_VALUE from the API means unreadable too: pass it, it is outside 0..100).
 * * [batteryStatus]: `BatteryManager.BATTERY_STATUS_*` (2 CHARGING, 5 FULL, ...), null if unknown.
 *   Only CHARGING counts as charging, as the board reads `dumpsys battery`.
 */
data class AndroidReading(
    val thermalStatus: Int?,
    val thermalHeadroom: Double = Double.NaN,
    val batteryLevel: Int?,
    val batteryStatus: Int?,
) {
    /** The thermal status as the switcher takes it: null (unreadable) unless one of NONE..SHUTDOWN. */
    val validThermalStatus: Int? get() = thermalStatus?.takeIf { it in 0 until Lut.ANDROID_THERMAL_STATUSES.size }

    /** Why the thermal status gave no reading, or null when it did. */
    val thermalError: String? get() = when {
        thermalStatus == null -> "no thermal status"
        validThermalStatus == null -> "thermal status $thermalStatus is not one of NONE..SHUTDOWN"
        else -> null
    }

    /** The thermal headroom as the switcher takes it: null (a failed read) unless within HEADROOM_MIN..HEADROOM_MAX and no denormal. */
    val validHeadroom: Double? get() = thermalHeadroom.takeIf {
        it >= HEADROOM_MIN && it <= HEADROOM_MAX && (it == 0.0 || it.toFloat() >= java.lang.Float.MIN_NORMAL)
    }

    /** Why the thermal headroom gave no reading, or null when it did. */
    val headroomError: String? get() = when {
        thermalHeadroom.isNaN() -> "thermal headroom NaN: the phone cannot forecast now"
        thermalHeadroom > 0.0 && thermalHeadroom.toFloat() < java.lang.Float.MIN_NORMAL -> "thermal headroom ${Py.g(thermalHeadroom)} is no float's forecast (below ${Py.g(FLOAT_MIN_NORMAL)})"
        validHeadroom == null -> "thermal headroom ${Py.g(thermalHeadroom)} is outside ${Py.g(HEADROOM_MIN)}..${Py.g(HEADROOM_MAX)}"
        else -> null
    }

    /** The battery level as the switcher takes it: null (unknown) unless 0..100 %. */
    val validBatteryLevel: Int? get() = batteryLevel?.takeIf { it in 0..100 }

    val charging: Boolean get() = batteryStatus == BATTERY_STATUS_CHARGING

    companion object {
        const val BATTERY_STATUS_CHARGING = 2
        /** hydra_edge.runtime.signals.android.HEADROOM_RANGE: beyond 10x the severe point is a broken HAL. */
        const val HEADROOM_MIN = 0.0
        const val HEADROOM_MAX = 10.0
        /** hydra_edge.runtime.signals.android.FLOAT_MIN_NORMAL: the forecast is a float; below its smallest normal is garbage. */
        const val FLOAT_MIN_NORMAL = java.lang.Float.MIN_NORMAL.toDouble()
        /** Where Android's headroom says severe throttling begins: a forecast at or past it counts as SEVERE. */
        const val HEADROOM_SEVERE = 1.0
        val SEVERE = Lut.ANDROID_THERMAL_STATUSES.indexOf("SEVERE").toDouble()
    }
}

/** The selection's inputs after the fail-safe rules (a held reading, or the assumed worst). */
data class Reading(val batteryPct: Double, val charging: Boolean, val thermal: Double)

/**
 * One change of head count: when, at which poll, why, and on what reading. [reason] reads as on a
 * board: "start", "state", "fallback: ...", a failing sensor after a colon ("state: thermal unknown
 * since 31 s"), the latency loop's own reasons ("latency p90 ...", "probe of ...") after "; ".
 */
data class SwitchEvent(val time: Double, val poll: Int, val fromHeads: Int?, val toHeads: Int, val reason: String, val reading: Reading?)

/**
 * The on-phone switcher: hydra_edge.runtime.switcher.Switcher's decisions for an Android app.
 *
 * The app calls [poll] with its signals every second or so (and [observe] with each single-image
 * inference's time in ms when the latency loop is on), and runs [heads]. The table picks a head
 * count with bands, hysteresis and dwell; the fail-safe rules hold a failed signal's last reading
 * for stale_after_s and then assume the worst band, and let the head count rise only on a reading
 * that has persisted raise_after_s; the latency loop only caps. Loading and running the model is
 * the app's: this class decides, and says why in [events].
 *
 * [open] reads lut.json (checked against the bundle's manifest); a lut.json that cannot be used is
 * one line in the first event's reason, and the bundle's smallest head count runs.
 */
class Switcher(
    val table: Table,
    val settings: SignalSettings,
    private val clock: () -> Double,
    /** Why the table is the one-cell fallback (lut.json unusable), or null. */
    val fallback: String? = null,
    val loop: LatencyLoop? = null,
    private val log: Logger = Logger.NONE,
    /** Where corrections are written: the app's background executor; by default inline. */
    private val saver: Executor = Executor { it.run() },
) {
    val events: MutableList<SwitchEvent> = ArrayList()
    var polls = 0
        private set
    var heads: Int? = null
        private set
    private var ceiling: Int? = null
    private var ceilingAt = Double.NEGATIVE_INFINITY
    var reading: Reading? = null
        private set
    private val lock = Any()
    /** Head counts whose artefact would not load or rebuild ([loadFailed]). */
    private val broken = HashSet<Int>()

    private val unknownThermal = settings.assumedHot ?: Double.NaN
    private val assume = if (settings.assumedHot == null) "the hottest band" else "${describeThermal(settings.assumedHot)} (assumed_hot)"
    private val thermal = Hold("thermal", ::describeThermal, unknownThermal, assume, settings, log)
    /** The forecast counts where the table was built on it and this phone reads it. */
    private val namesHeadroom = table.thermalHeadroom && settings.namesHeadroom
    private val headroom = Hold<Double>("thermal headroom", { h -> Py.g(h) }, Double.NaN, assume, settings, log)
    private val battery = Hold<Pair<Double, Boolean>>("battery", { b -> "${Py.f(b.first, 0)} %${if (b.second) " charging" else ""}" },
        Double.NaN to false, "the lowest battery band", settings, log)
    private val raiseGate = RaiseGate(settings.raiseAfterS)

    private class Input<T>(val value: T, val note: String?, val held: Boolean)

    private fun describeThermal(t: Double): String =
        if (table.thermalSource == "android") "thermal status ${Py.g(t)} (${Lut.ANDROID_THERMAL_STATUSES.getOrNull(t.toInt()).takeIf { t.toInt() >= 0 } ?: "None"})"
        else "${Py.f(t, 1)} °C"

    /** Read the signals once and switch if the table says so; returns the head count now running. */
    fun poll(state: AndroidReading): Int = synchronized(lock) {
        polls += 1
        val now = clock()
        val th = thermalInput(state, now)
        val bat = batteryInput(state, now)
        val (batteryPct, charging) = bat.value
        val reading = Reading(batteryPct, charging, th.value)
        var ceil = loadable(table.select(batteryPct, charging, th.value, ceiling ?: 0, now - ceilingAt))
        val current = ceiling
        if (current != null) { // more heads only on a reading that has persisted
            val order = table.heads
            val fresh = !(th.held || bat.held)
            ceil = order[raiseGate.gate(order.indexOf(current), order.indexOf(ceil), now, fresh)]
        }
        val stateChanged = ceil != ceiling
        if (stateChanged) { ceiling = ceil; ceilingAt = now }
        this.reading = reading
        var latency: String? = null
        if (loop != null) {
            loop.budget(batteryPct, charging)
            latency = judgeLatency(now)
        }
        val h = limited()
        if (h != heads) {
            var reason = if (heads == null) "start" else if (stateChanged) "state" else ""
            if (fallback != null && heads == null) reason = "fallback: $fallback"
            if (reason.isNotEmpty()) {
                val notes = listOfNotNull(th.note, bat.note).toMutableList()
                if (h < ceil && latency == null) notes.add("held at $h heads by the latency loop")
                if (notes.isNotEmpty()) reason = "$reason: ${notes.joinToString(", ")}"
            }
            switch(h, listOf(reason, latency ?: "").filter { it.isNotEmpty() }.joinToString("; "), reading, now)
        }
        h
    }

    /** Feed one single-image inference's latency (ms) of [ranHeads] to the latency loop; switch if it says so. */
    fun observe(ranHeads: Int, ms: Double) {
        val l = loop ?: return
        synchronized(lock) {
            val now = clock()
            l.governor.observe(ranHeads, ms, now)
            if (ceiling == null) return
            val reason = judgeLatency(now)
            val h = limited()
            if (h != heads) switch(h, reason ?: "latency", reading, now)
        }
    }

    /**
     * The app could not load or rebuild [failedHeads]' artefact ([message], one line): that head count is
     * not tried again, the fewest heads run now (reason `load failed: ...`), and the table's choice is
     * from then on the largest head count below it that has not failed, as on a board
     * (hydra_edge.runtime.switcher.Switcher.predict). False when [failedHeads] is the fewest heads already:
     * nothing is left to fall back to, and the app stops.
     */
    fun loadFailed(failedHeads: Int, message: String): Boolean = synchronized(lock) {
        val fastest = table.heads[0]
        if (failedHeads == fastest) return false
        log.log("WARNING", "cannot run $failedHeads heads ($message); running $fastest")
        broken.add(failedHeads)
        val now = clock()
        ceiling = fastest
        ceilingAt = now
        switch(fastest, "load failed: $message", null, now)
        true
    }

    /** [heads], or the largest head count below it that has not failed to load (else the fewest). */
    private fun loadable(heads: Int): Int = table.heads.filter { it <= heads && it !in broken }.maxOrNull() ?: table.heads[0]

    /** The last [n] switches' reasons, the newest last: what a display says the phone is doing and why. */
    fun reasons(n: Int = 5): List<String> = synchronized(lock) { events.takeLast(n).map { it.reason } }

    private fun thermalInput(state: AndroidReading, now: Double): Input<Double> {
        val t = table.androidThermalInput(state.validThermalStatus)
        val why = state.thermalError ?: "no sensor gave a reading"
        val (value, note) = thermal.update(if (t.isNaN()) null else t, why, now)
        val status = Input(value, note, thermal.held)
        return if (namesHeadroom) withForecast(status, state, now) else status
    }

    /**
     * The hotter of the thermal status and the headroom forecast: at or past 1.0 at least SEVERE; a failed
     * forecast held like any signal, then unknown (the hottest band, or assumed_hot).
     */
    private fun withForecast(status: Input<Double>, state: AndroidReading, now: Double): Input<Double> {
        val (h, note) = headroom.update(state.validHeadroom, state.headroomError, now)
        val forecast = if (h.isNaN()) unknownThermal else if (h >= AndroidReading.HEADROOM_SEVERE) AndroidReading.SEVERE else Double.NEGATIVE_INFINITY
        val t = if (status.value.isNaN() || forecast.isNaN()) Double.NaN else Math.max(status.value, forecast)
        val forecastNote = if (note == null && forecast > status.value)
            "thermal headroom ${Py.g(h)} counts as ${Lut.ANDROID_THERMAL_STATUSES[AndroidReading.SEVERE.toInt()]}" else note
        val notes = listOfNotNull(status.note, forecastNote)
        return Input(t, if (notes.isEmpty()) null else notes.joinToString(", "), status.held || headroom.held)
    }

    private fun batteryInput(state: AndroidReading, now: Double): Input<Pair<Double, Boolean>> {
        val level = state.validBatteryLevel
        val (value, note) = if (level == null) battery.update(null, if (state.batteryLevel == null) "no battery level" else
            "battery level ${state.batteryLevel} % is outside 0..100 %", now)
            else battery.update(level.toDouble() to state.charging, null, now)
        return Input(value, note, battery.held)
    }

    private fun limited(): Int = if (loop == null) ceiling!! else loop.governor.limit(ceiling!!)

    private fun judgeLatency(now: Double): String? {
        val l = loop!!
        val reason = l.governor.step(limited(), ceiling!!, l.budgetNow, now)
        val data = l.snapshot()
        if (data != null) saver.execute { l.save(data) } // an inference never waits for the disk
        return reason
    }

    private fun switch(to: Int, reason: String, reading: Reading?, now: Double) {
        val event = SwitchEvent(now, polls, heads, to, reason, reading)
        events.add(event)
        log.log("INFO", "heads ${heads ?: "None"} -> $to ($reason) at poll $polls: $reading")
        heads = to
    }

    companion object {
        /**
         * The switcher for a bundle folder: lut.json (or [lut]) read once and checked against the
         * manifest; with [loop], the latency loop and its saved correction beside lut.json. A lut.json
         * that cannot be used (refused by the reader, or one that trips it up): the bundle's smallest head
         * count, and why, in the first event.
         */
        fun open(bundle: File, settings: SignalSettings = SignalSettings(), clock: () -> Double,
                 lut: File = File(bundle, "lut.json"), loop: LoopSettings? = null,
                 wallClock: () -> Double = { System.currentTimeMillis() / 1e3 }, log: Logger = Logger.NONE,
                 saver: Executor = Executor { it.run() }): Switcher {
            return try {
                val table = Lut.read(lut, bundle)
                val latency = if (loop != null) LatencyLoop(lut, table, loop, wallClock, log) else null
                Switcher(table, settings, clock, null, latency, log, saver)
            } catch (e: LutException) {
                fallback(bundle, settings, clock, e.message ?: "${lut.path}: unusable", log, saver)
            } catch (e: RecordException) {
                throw e // the bundle itself (its manifest) is unusable: there is nothing to run
            } catch (e: RuntimeException) {
                // a table the reader should have refused but tripped over: never a crash, the fewest heads
                fallback(bundle, settings, clock, "${lut.path}: cannot be used ($e); re-run hydra-edge lut", log, saver)
            }
        }

        private fun fallback(bundle: File, settings: SignalSettings, clock: () -> Double, why: String, log: Logger,
                             saver: Executor): Switcher {
            val artefacts = Manifest.read(bundle).artefacts
            if (artefacts.isEmpty()) throw BundleException("${File(bundle, Manifest.FILE).path} lists no artefacts (its convert stopped " +
                "before the first); re-run hydra-edge convert for this bundle")
            val table = Table.fallback(artefacts.minByOrNull { it.heads }!!)
            log.log("WARNING", "$why; running the smallest head count (${table.heads[0]})")
            return Switcher(table, settings, clock, why, null, log, saver)
        }
    }
}
