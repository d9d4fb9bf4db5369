package org.hydraedge.core

/**
 * The fail-safe rules of hydra_edge.runtime.failsafe: a sensor that fails never buys heads.
 *
 * * A signal that stops reading keeps its last good reading for `staleAfterS`, so one bad poll
 *   does not move the head count; after that it is [unknown] (the worst band).
 * * The head count rises only when the table has asked for more for `raiseAfterS` without a break,
 *   on readings taken at every poll ([RaiseGate]); it falls at once.
 * * A signal going bad is logged once, and once more when it has read well for `raiseAfterS`.
 */
data class SignalSettings(
    val staleAfterS: Double = 30.0,
    val raiseAfterS: Double = 10.0,
    /** In the table's thermal unit (an Android thermal status); null: unknown is the hottest band. */
    val assumedHot: Double? = null,
    /**
     * Whether this phone reads Android's thermal headroom (`PowerManager.getThermalHeadroom`, API 30+), as a
     * board's profile names `cmd thermalservice headroom`: the forecast counts only where this and the
     * table (lut.json's thermal.headroom) both name it. An app on API < 30 passes false.
     */
    val namesHeadroom: Boolean = true,
) {
    /** These settings, every other field kept, on a phone that does ([named]) or does not read the thermal headroom. */
    fun namingHeadroom(named: Boolean): SignalSettings = copy(namesHeadroom = named)

    init {
        // hydra_edge.records.target.Signals: the same ranges, so a phone refuses what a board refuses
        require(staleAfterS > 0 && staleAfterS <= Checks.LARGE) { "stale_after_s = $staleAfterS: must be > 0" }
        require(raiseAfterS >= 0 && raiseAfterS <= 1e6) { "raise_after_s = $raiseAfterS: must be 0..1e6" }
        require(assumedHot == null || (assumedHot >= -273.15 && assumedHot <= 1000.0)) { "assumed_hot = $assumedHot: must be -273.15..1000" }
    }
}

/** Where the library's warnings go (an app passes android.util.Log; tests collect them). */
fun interface Logger {
    fun log(level: String, message: String)

    companion object {
        val NONE = Logger { _, _ -> }
    }
}

/** One signal: its last good reading, since when it has been failing, and what was logged. */
class Hold<T : Any>(
    val name: String,
    private val describe: (T) -> String,
    private val unknown: T,
    private val assume: String,
    private val settings: SignalSettings,
    private val log: Logger,
) {
    var last: T? = null
        private set
    private var lastAt = Double.NEGATIVE_INFINITY
    private var badSince: Double? = null
    private var goodSince: Double? = null
    private var failures = 0
    /** Whether the last update returned an older reading, not this poll's. */
    var held = false
        private set

    /**
     * The reading to select on ([value], the held one, or unknown) and, when it is not this poll's
     * own, a note for the switch event ("thermal unknown since 31 s").
     */
    fun update(value: T?, why: String?, now: Double): Pair<T, String?> {
        if (value != null) {
            last = value; lastAt = now; held = false
            recovering(now)
            return value to null
        }
        goodSince = null
        failures += 1
        val l = last
        val recent = if (now - lastAt < settings.staleAfterS) l else null
        held = recent != null
        if (badSince == null) {
            badSince = now; failures = 1
            if (recent != null) log.log("WARNING", "$name unreadable ($why) — holding the last reading ${describe(recent)} for up to ${Py.g(settings.staleAfterS)} s")
            else log.log("WARNING", "$name unreadable ($why) — no recent reading; assuming $assume")
        }
        if (recent != null) return recent to "$name unreadable, holding ${describe(recent)} from ${Py.f(now - lastAt, 0)} s ago"
        val since = now - (if (l != null) lastAt else badSince!!)
        return unknown to "$name unknown since ${Py.f(since, 0)} s"
    }

    private fun recovering(now: Double) {
        val bad = badSince ?: return
        if (goodSince == null) goodSince = now
        if (now - goodSince!! >= settings.raiseAfterS) {
            log.log("WARNING", "$name readable again (${describe(last!!)}) after ${Py.f(now - bad, 0)} s with $failures failed reads")
            badSince = null; goodSince = null
        }
    }
}

/**
 * Lets the head count rise only after the table has asked for more for `raiseAfterS`, on candidate
 * ranks (0: fewest heads). While it waits it keeps the least the table asked for; a poll on a held
 * reading (`fresh` false) starts the wait over: that reading did not persist, it was assumed to.
 */
class RaiseGate(private val raiseAfterS: Double) {
    private var since: Double? = null
    private var floor = 0

    fun gate(current: Int, proposed: Int, now: Double, fresh: Boolean = true): Int {
        if (proposed <= current || !fresh) {
            since = null
            return Math.min(proposed, current)
        }
        if (since == null) { since = now; floor = proposed }
        floor = Math.min(floor, proposed)
        if (now - since!! < raiseAfterS) return current
        since = null
        return floor
    }
}
