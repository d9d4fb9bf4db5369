package org.hydraedge.core

/**
 * The latency loop's numbers (hydra_edge.runtime.latency_governor.LoopSettings), same defaults and
 * the same refusals: a phone running a few inferences a second or more.
 */
class LoopSettings(
    /** null: the table's budget_ms; either way scaled by the battery band. */
    val budgetMs: Double? = null,
    val windowS: Double = 5.0,
    val sustainS: Double = 10.0,
    val dwellS: Double = 30.0,
    val probeInferences: Int = 20,
    val maxSwitchesPerMinute: Int = 4,
    val minSamples: Int = 5,
    val maxSamples: Int = 256,
    val absurdMs: Double = 60_000.0,
    val expireS: Double = 3600.0,
) {
    init {
        if (budgetMs != null) require(budgetMs > 0 && budgetMs < Double.POSITIVE_INFINITY) {
            "the latency loop's budget_ms: a latency budget of $budgetMs ms cannot be met; give the time one inference may take as a positive number of milliseconds (e.g. 80)"
        }
        for ((name, v) in listOf("window_s" to windowS, "sustain_s" to sustainS, "dwell_s" to dwellS, "absurd_ms" to absurdMs, "expire_s" to expireS))
            require(v > 0 && v < Double.POSITIVE_INFINITY) { "latency loop setting $name = $v: must be a positive number" }
        for ((name, v, least) in listOf(Triple("probe_inferences", probeInferences, 1), Triple("max_switches_per_minute", maxSwitchesPerMinute, 2),
                Triple("min_samples", minSamples, 1), Triple("max_samples", maxSamples, 1)))
            require(v >= least) { "latency loop setting $name = $v: must be a whole number of at least $least" }
        require(minSamples <= maxSamples) { "latency loop settings: min_samples ($minSamples) is more than max_samples ($maxSamples); the p90 could never be taken" }
    }
}

/** What one head count was observed to take when the loop last judged it (a correction record entry). */
data class LearnedLatency(val heads: Int, val p90Ms: Double, val slowdown: Double, val samples: Long)

/** The p-th percentile (0..100) of sorted values by linear interpolation, as numpy's default (latency.percentile). */
fun percentile(sorted: List<Double>, q: Double): Double {
    val position = (sorted.size - 1) * q / 100.0
    val low = Math.floor(position).toInt()
    val high = Math.ceil(position).toInt()
    val weight = position - low
    return sorted[low] * (1.0 - weight) + sorted[high] * weight
}

/**
 * The cap on the head count from observed timings: hydra_edge.runtime.latency_governor.LatencyGovernor,
 * rule for rule. What runs is min(the table's choice after the fail-safe rules, [cap]): the governor
 * only takes heads away.
 *
 * * Per head count, a p90 over the last `windowS` (at most `maxSamples`, at least `minSamples`).
 * * Down: p90 over budget for `sustainS` -> the largest head count below predicted to fit.
 * * Up: the slow-down gone for `dwellS` -> probe the largest fitting head count for `probeInferences`;
 *   kept if its p90 fits, else back down, the next probe at most one below, the dwell doubling per
 *   failed probe (up to 8x).
 * * At most `maxSwitchesPerMinute` changes of the cap in any 60 s.
 * * NaN, infinite, negative or absurd timings are ignored and counted by kind.
 */
class LatencyGovernor(
    calibratedMs: Map<Int, Double>,
    val settings: LoopSettings,
    private val log: Logger,
    restored: Pair<Map<Int, LearnedLatency>, Double>? = null,
) {
    private class Probe(val heads: Int, val backTo: Int, val timings: MutableList<Double> = ArrayList())

    val calibrated: Map<Int, Double> = calibratedMs.toSortedMap()
    val order: List<Int> = calibrated.keys.toList()
    var cap: Int = order.last()
        private set
    val learned: MutableMap<Int, LearnedLatency> = LinkedHashMap(restored?.first ?: emptyMap())
    /** Counts changes to [learned] that a saved copy lacks. */
    var revision = 0
        private set
    val ignored: MutableMap<String, Int> = LinkedHashMap()
    val decisions: ArrayDeque<Pair<Double, String>> = ArrayDeque()
    private var restoredAge: Double? = restored?.second
    private val samples: Map<Int, ArrayDeque<Pair<Double, Double>>> = order.associateWith { ArrayDeque<Pair<Double, Double>>() }
    private var overSince: Double? = null
    private var underSince: Double? = null
    private var probe: Probe? = null
    private var probeLimit: Int? = null
    private val failed = HashMap<Int, Int>()
    private val switches = ArrayDeque<Double>()

    val probing: Int? get() = probe?.heads

    /** Record one inference's latency in ms; false (and counted) when it is garbage. */
    fun observe(heads: Int, ms: Double, now: Double): Boolean {
        val why = garbage(heads, ms)
        if (why != null) {
            val n = (ignored[why] ?: 0) + 1
            ignored[why] = n
            if (n == 1) log.log("WARNING", "ignoring a latency of ${Py.repr(ms)} ms for $heads heads ($why); further ones are counted, not logged")
            return false
        }
        val p = probe
        if (p != null && heads == p.heads) p.timings.add(ms)
        val window = samples.getValue(heads)
        window.addLast(now to ms)
        while (window.size > settings.maxSamples) window.removeFirst()
        return true
    }

    private fun garbage(heads: Int, ms: Double): String? = when {
        heads !in samples -> "not a head count of the table"
        ms.isNaN() -> "not a number"
        ms.isInfinite() -> "infinite"
        ms < 0 -> "negative"
        ms > settings.absurdMs -> "over ${Py.g(settings.absurdMs)} ms"
        else -> null
    }

    /** The p90 of [heads]' timings in the window, or null with fewer than minSamples. */
    fun p90(heads: Int, now: Double): Double? {
        val window = samples.getValue(heads)
        while (window.isNotEmpty() && window.first().first < now - settings.windowS) window.removeFirst()
        if (window.size < settings.minSamples) return null
        return percentile(window.map { it.second }.sorted(), 90.0)
    }

    fun limit(ceiling: Int): Int = Math.min(ceiling, cap)

    /** Judge the timings so far; the reason when the cap changed or a probe was judged, else null. */
    fun step(running: Int, ceiling: Int, budgetMs: Double, now: Double): String? {
        if (restoredAge != null) return restore(budgetMs, now)
        if (probe != null) return judgeProbe(running, budgetMs, now)
        val p90 = p90(running, now) ?: return null
        if (p90 > budgetMs) {
            underSince = null
            return over(running, p90, budgetMs, now)
        }
        overSince = null
        return under(running, ceiling, p90, budgetMs, now)
    }

    private fun over(running: Int, p90: Double, budgetMs: Double, now: Double): String? {
        if (overSince == null) overSince = now
        val held = now - overSince!!
        if (held < settings.sustainS || running == order[0] || !maySwitch(now, 1)) return null
        val slowdown = p90 / calibrated.getValue(running)
        val (target, predicted, basis) = largestFitting(order.filter { it < running }, budgetMs, slowdown, now)
        learn(running, p90, samples.getValue(running).size.toLong())
        overSince = null; probeLimit = null
        cap = target
        return decided(now, "latency p90 ${Py.g(p90, 3)} ms over budget ${Py.g(budgetMs, 3)} ms for ${Py.f(held, 0)} s at " +
            "$running heads: $target heads, predicted ${Py.g(predicted, 3)} ms ($basis)")
    }

    private fun under(running: Int, ceiling: Int, p90: Double, budgetMs: Double, now: Double): String? {
        if (cap >= ceiling) { underSince = null; return null }
        val limit = probeLimit
        if (limit != null && limit <= running) probeLimit = null
        val top = Math.min(ceiling, probeLimit ?: ceiling)
        val slowdown = p90 / calibrated.getValue(running)
        val fitting = order.filter { it in (running + 1)..top }
            .map { h -> Triple(h, predict(h, slowdown, now).first, 0) }
            .filter { it.second <= budgetMs }
        if (fitting.isEmpty()) { underSince = null; return null }
        if (underSince == null) underSince = now
        val gone = now - underSince!!
        val (heads, predicted) = fitting.last()
        val dwell = settings.dwellS * Math.pow(2.0, Math.min(failed[heads] ?: 0, MAX_BACKOFF_DOUBLINGS).toDouble())
        if (gone < dwell || !maySwitch(now, 2)) return null
        probe = Probe(heads, running)
        underSince = null
        cap = heads
        return decided(now, "latency back under budget for ${Py.f(gone, 0)} s ($running heads p90 ${Py.g(p90, 3)} ms, " +
            "$heads heads predicted ${Py.g(predicted, 3)} ms): probing $heads heads for ${settings.probeInferences} inferences")
    }

    private fun judgeProbe(running: Int, budgetMs: Double, now: Double): String? {
        val p = probe!!
        if (running != p.heads) { // the table or a fail-safe rule lowered the head count: no verdict
            probe = null; cap = p.backTo
            if (p.backTo >= running) return null
            return decided(now, "probe of ${p.heads} heads ended by the table's choice ($running heads): back to ${p.backTo} heads")
        }
        if (p.timings.size < settings.probeInferences) return null
        probe = null
        val p90 = percentile(p.timings.sorted(), 90.0)
        learn(p.heads, p90, p.timings.size.toLong())
        if (p90 <= budgetMs) {
            probeLimit = null
            failed.remove(p.heads)
            val reason = "probe of ${p.heads} heads: p90 ${Py.g(p90, 3)} ms within budget ${Py.g(budgetMs, 3)} ms over " +
                "${p.timings.size} inferences: keeping ${p.heads} heads"
            remember(now, reason)
            return reason
        }
        val below = order[order.indexOf(p.heads) - 1]
        probeLimit = below; cap = p.backTo
        failed[p.heads] = (failed[p.heads] ?: 0) + 1
        return decided(now, "probe of ${p.heads} heads: p90 ${Py.g(p90, 3)} ms over budget ${Py.g(budgetMs, 3)} ms; back to ${p.backTo} heads")
    }

    /** The first step after a restart: cap by the saved correction, as a step down would have. */
    private fun restore(budgetMs: Double, now: Double): String? {
        val age = restoredAge!!
        restoredAge = null
        if (learned.isEmpty()) return null
        val slowdown = learned.values.maxOf { it.slowdown }
        fun predicted(heads: Int): Double = learned[heads]?.p90Ms ?: (calibrated.getValue(heads) * slowdown)
        val fits = order.filter { predicted(it) <= budgetMs }
        cap = if (fits.isNotEmpty()) fits.last() else order[0]
        if (cap == order.last()) return null
        val over = order[order.indexOf(cap) + 1]
        return decided(now, "latency correction saved ${Py.f(age, 0)} s ago: $over heads predicted " +
            "${Py.g(predicted(over), 3)} ms, over budget ${Py.g(budgetMs, 3)} ms: at most $cap heads")
    }

    /** [heads]' latency: its windowed p90 where it has one, else calibrated x the slow-down seen. */
    private fun predict(heads: Int, slowdown: Double, now: Double): Pair<Double, String> {
        val observed = p90(heads, now)
        if (observed != null) return observed to "observed p90"
        val c = calibrated.getValue(heads)
        return c * slowdown to "calibrated ${Py.g(c, 3)} ms x ${Py.f(slowdown, 2)}"
    }

    private fun largestFitting(candidates: List<Int>, budgetMs: Double, slowdown: Double, now: Double): Triple<Int, Double, String> {
        val predictions = candidates.map { h -> predict(h, slowdown, now).let { Triple(h, it.first, it.second) } }
        return predictions.lastOrNull { it.second <= budgetMs } ?: predictions[0]
    }

    private fun learn(heads: Int, p90: Double, count: Long) {
        learned[heads] = LearnedLatency(heads, p90, p90 / calibrated.getValue(heads), count)
        revision += 1
    }

    private fun maySwitch(now: Double, needed: Int): Boolean {
        while (switches.isNotEmpty() && switches.first() <= now - MINUTE_S) switches.removeFirst()
        return switches.size + needed <= settings.maxSwitchesPerMinute
    }

    private fun remember(now: Double, reason: String) {
        decisions.addLast(now to reason)
        while (decisions.size > 20) decisions.removeFirst()
        log.log("INFO", reason)
    }

    private fun decided(now: Double, reason: String): String {
        switches.addLast(now)
        remember(now, reason)
        return reason
    }

    companion object {
        const val MINUTE_S = 60.0
        const val MAX_BACKOFF_DOUBLINGS = 3
    }
}
