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

/**
 * The p-th percentile (0..100) of sorted values by linear interpolation, as numpy's default (latency.percentile):
 * numpy's two-sided form, which never leaves [lower, upper], so a window of equal timings has them as its p90.
 */
fun percentile(sorted: List<Double>, q: Double): Double {
    val position = (sorted.size - 1) * (q / 100.0)
    val low = Math.floor(position).toInt()
    val high = Math.ceil(position).toInt()
    val weight = position - low
    val a = sorted[low]
    val b = sorted[high]
    return if (weight >= 0.5) b - (b - a) * (1.0 - weight) else a + (b - a) * weight
}

/**
 * What the running head count's windowed timings say about a larger one's latency (latency_governor.Slowdown):
 * the mean of its timings up to their p90 over its calibrated latency scales with the work ([scale]);
 * the p90's excess over that mean ([spreadMs]: jitter, per-inference overheads) does not, and is added in ms.
 */
class Slowdown(val scale: Double, val spreadMs: Double) {
    /** A head count calibrated at [calibratedMs]: its predicted p90 and how it was predicted. */
    fun predict(calibratedMs: Double): Pair<Double, String> {
        val spread = if (spreadMs != 0.0) " + ${Py.g(spreadMs, 3)} ms spread" else ""
        return (calibratedMs * scale + spreadMs) to "calibrated ${Py.g(calibratedMs, 3)} ms x ${Py.f(scale, 2)}$spread"
    }

    companion object {
        /** From sorted timings (ms) of a head count calibrated at [calibratedMs]; summed in order, as Python sums. */
        fun of(timings: List<Double>, calibratedMs: Double): Slowdown {
            val p90 = percentile(timings, 90.0)
            var shortfall = 0.0
            var below = 0
            for (ms in timings) if (ms <= p90) { shortfall += p90 - ms; below += 1 }
            shortfall /= below
            return Slowdown((p90 - shortfall) / calibratedMs, shortfall)
        }
    }
}

/**
 * The cap on the head count from observed timings: hydra_edge.runtime.latency_governor.LatencyGovernor,
 * rule for rule. What runs is min(the table's choice after the fail-safe rules, [cap]): the governor
 * only takes heads away.
 *
 * * Per head count, a p90 over the last `windowS` (at most `maxSamples`, at least `minSamples`).
 * * A head count without timings in the window: predicted from the running one's, a smaller one by its
 *   p90 / calibrated, a larger one by [Slowdown.of].
 * * Down: p90 over budget for `sustainS` -> the largest head count below predicted to fit.
 * * Up: a larger head count predicted to fit for `dwellS` -> probe the largest such for `probeInferences`;
 *   kept if its p90 fits, else back down, the next probe at most one below, the dwell doubling per
 *   failed probe (up to 8x). None predicted to fit but the running one within budget for 8 x `dwellS`:
 *   probe the most the next probe may try all the same (its failure doubles nothing).
 * * At most `maxSwitchesPerMinute` changes of the cap in any 60 s.
 * * NaN, infinite, negative or absurd timings are ignored and counted by kind.
 */
class LatencyGovernor(
    calibratedMs: Map<Int, Double>,
    val settings: LoopSettings,
    private val log: Logger,
    restored: Pair<Map<Int, LearnedLatency>, Double>? = null,
) {
    private class Probe(val heads: Int, val backTo: Int, val predicted: Boolean, val timings: MutableList<Double> = ArrayList())

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
    private var underSince: Double? = null // since a larger head count has been predicted to fit
    private var withinSince: Double? = null // since the running one has fitted, held below the table
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
    fun p90(heads: Int, now: Double): Double? = window(heads, now)?.let { percentile(it, 90.0) }

    /** [heads]' timings in the window, sorted, or null with fewer than minSamples. */
    private fun window(heads: Int, now: Double): List<Double>? {
        val window = samples.getValue(heads)
        while (window.isNotEmpty() && window.first().first < now - settings.windowS) window.removeFirst()
        if (window.size < settings.minSamples) return null
        return window.map { it.second }.sorted()
    }

    fun limit(ceiling: Int): Int = Math.min(ceiling, cap)

    /** Judge the timings so far; the reason when the cap changed or a probe was judged, else null. */
    fun step(running: Int, ceiling: Int, budgetMs: Double, now: Double): String? {
        if (restoredAge != null) return restore(budgetMs, now)
        if (probe != null) return judgeProbe(running, budgetMs, now)
        val timings = window(running, now) ?: return null
        val p90 = percentile(timings, 90.0)
        if (p90 > budgetMs) {
            underSince = null; withinSince = null
            return over(running, p90, budgetMs, now)
        }
        overSince = null
        return under(running, ceiling, timings, p90, budgetMs, now)
    }

    private fun over(running: Int, p90: Double, budgetMs: Double, now: Double): String? {
        if (overSince == null) overSince = now
        val held = now - overSince!!
        if (held < settings.sustainS || running == order[0] || !maySwitch(now, 1)) return null
        val seen = Slowdown(p90 / calibrated.getValue(running), 0.0) // down: the p90's slow-down, spread and all
        val predictions = predictions(order.filter { it < running }, seen, now)
        val (target, predicted, basis) = predictions.lastOrNull { it.second <= budgetMs } ?: predictions[0]
        learn(running, p90, samples.getValue(running).size.toLong())
        overSince = null; probeLimit = null
        cap = target
        return decided(now, "latency p90 ${Py.g(p90, 3)} ms over budget ${Py.g(budgetMs, 3)} ms for ${Py.f(held, 0)} s at " +
            "$running heads: $target heads, predicted ${Py.g(predicted, 3)} ms ($basis)")
    }

    private fun under(running: Int, ceiling: Int, timings: List<Double>, p90: Double, budgetMs: Double, now: Double): String? {
        if (cap >= ceiling) { underSince = null; withinSince = null; return null }
        if (withinSince == null) withinSince = now
        val limit = probeLimit
        if (limit != null && limit <= running) probeLimit = null
        val top = Math.min(ceiling, probeLimit ?: ceiling)
        val seen = Slowdown.of(timings, calibrated.getValue(running))
        val predictions = predictions(order.filter { it in (running + 1)..top }, seen, now)
        val fitting = predictions.filter { it.second <= budgetMs }
        if (fitting.isNotEmpty()) {
            if (underSince == null) underSince = now
            val gone = now - underSince!!
            val (heads, predicted) = fitting.last()
            val dwell = settings.dwellS * Math.pow(2.0, Math.min(failed[heads] ?: 0, MAX_BACKOFF_DOUBLINGS).toDouble())
            if (gone < dwell || !maySwitch(now, 2)) return null
            return startProbe(heads, running, true, now, "latency back under budget for ${Py.f(gone, 0)} s " +
                "($running heads p90 ${Py.g(p90, 3)} ms, $heads heads predicted ${Py.g(predicted, 3)} ms)")
        }
        underSince = null
        val within = now - withinSince!!
        if (within < settings.dwellS * Math.pow(2.0, MAX_BACKOFF_DOUBLINGS.toDouble()) || !maySwitch(now, 2)) return null
        val (heads, predicted, basis) = predictions.last()
        return startProbe(heads, running, false, now, "latency within budget for ${Py.f(within, 0)} s at $running " +
            "heads (p90 ${Py.g(p90, 3)} ms), $heads heads predicted ${Py.g(predicted, 3)} ms ($basis), which only a probe can tell")
    }

    private fun startProbe(heads: Int, running: Int, predicted: Boolean, now: Double, why: String): String {
        probe = Probe(heads, running, predicted)
        underSince = null; withinSince = null
        cap = heads
        return decided(now, "$why: probing $heads heads for ${settings.probeInferences} inferences")
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
        if (p.predicted) failed[p.heads] = (failed[p.heads] ?: 0) + 1
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

    /** Each of [candidates] with its predicted p90 and how: its own windowed p90, else from [seen]. */
    private fun predictions(candidates: List<Int>, seen: Slowdown, now: Double): List<Triple<Int, Double, String>> =
        candidates.map { h ->
            val observed = p90(h, now)
            if (observed != null) Triple(h, observed, "observed p90")
            else seen.predict(calibrated.getValue(h)).let { Triple(h, it.first, it.second) }
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
