package org.hydraedge.demo;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;

/**
 * How bench mode times head counts: hydra_edge/calibration_plan.py in Java, so a phone's calibration follows the
 * plan a board's does. Each head count is timed until the 95 % interval of its p90 (from the order statistics,
 * whatever the shape of the latencies) is within {@link Plan#within} of it, never under {@link Plan#minRuns}
 * runs and {@link Plan#minS} seconds, never past {@link Plan#capS} of its own time; in rounds that visit the open
 * head counts in a new random order, a block of runs each, so the phone's drift falls on all alike; each round
 * started only once the phone is back in the thermal state the calibration began in. The interval's ranks are
 * the Python plan's exactly (tests compare them over thousands of run counts).
 */
final class Rounds {
    static final double Q = 0.9;  // the quantile the table plans with
    // The stop rule looks after every block: built at 97 % per look, the interval at the stop holds the p90 at
    // least 95 % of the time (calibration_plan.LOOK_LEVEL)
    static final double LOOK_LEVEL = 0.97;
    static final int MIN_BLOCK_RUNS = 5;
    // The most timed runs a head count keeps (every one is in the record; calibration_plan.MAX_TIMED_RUNS)
    static final int MAX_TIMED_RUNS = 30000;

    private Rounds() {}

    /** A figure as Python's {@code :g} prints the gate's settings and statuses (2.0 as 2). */
    static String g(double v) {
        return v == Math.rint(v) && Math.abs(v) < 1e15 ? String.valueOf((long) v) : String.valueOf(v);
    }

    /**
     * 0-based indices (lo, hi) into n sorted timings whose values hold the true q-quantile with probability at
     * least level; null when n is too small for either end (calibration_plan.order_ranks: B ~ Binomial(n, q),
     * summed in log space).
     */
    static int[] orderRanks(int n, double q, double level) {
        double alpha = 1.0 - level;
        double logPmf = n * Math.log1p(-q);
        double odds = Math.log(q / (1.0 - q));
        double cdf = 0.0;
        int below = 0;
        for (int k = 0; k < n; k++) {
            cdf += Math.exp(logPmf);
            if (cdf <= alpha / 2) {
                below++;
            } else if (cdf >= 1.0 - alpha / 2) {
                return below > 0 ? new int[] {below - 1, k} : null;
            }
            logPmf += Math.log((double) (n - k) / (k + 1)) + odds;
        }
        return null;
    }

    /** The plan's settings, from the intent's "plan" JSON (calibrate's RoundsOptions); defaults as calibrate's. */
    static final class Plan {
        double within = 0.05;
        int minRuns = 50;
        double minS = 1.0;
        double capS = 60.0;
        double blockS = 0.25;
        int blockWarmup = 2;
        double gateMarginC = 2.0;
        double gateHeadroom = 0.7;
        double gateMaxWaitS = 120.0;
        double gatePollS = 1.0;
        int firstRound = 1;  // a resumed calibration numbers its rounds after the record's last

        /** The plan for {@code minRuns} runs at least, the rest from {@code json} (null: the defaults). */
        static Plan of(int minRuns, JSONObject json) throws JSONException {
            Plan p = new Plan();
            p.minRuns = minRuns;
            if (json == null) return p;
            p.within = json.optDouble("within", p.within);
            p.minS = json.optDouble("min_s", p.minS);
            p.capS = json.optDouble("cap_s", p.capS);
            p.blockS = json.optDouble("block_s", p.blockS);
            p.blockWarmup = json.optInt("block_warmup", p.blockWarmup);
            p.gateMarginC = json.optDouble("gate_margin_c", p.gateMarginC);
            p.gateHeadroom = json.optDouble("gate_headroom", p.gateHeadroom);
            p.gateMaxWaitS = json.optDouble("gate_max_wait_s", p.gateMaxWaitS);
            p.firstRound = json.optInt("first_round", p.firstRound);
            double[] values = {p.within, p.minS, p.capS, p.blockS, p.gateMarginC, p.gateHeadroom, p.gateMaxWaitS};
            for (double v : values) {
                if (Double.isNaN(v) || Double.isInfinite(v) || v < 0) {
                    throw new JSONException("plan " + json + ": every figure must be finite and not negative");
                }
            }
            if (p.within <= 0 || p.blockWarmup < 0 || p.firstRound < 1) {
                throw new JSONException("plan " + json + ": within must be over 0, block_warmup not negative, first_round "
                        + "at least 1");
            }
            return p;
        }
    }

    /** One head count's timings so far (seconds, kept sorted), its blocks and, once stopped, why. */
    static final class Tally {
        final int heads;
        final List<Double> sortedS = new ArrayList<Double>();
        double timedS;  // the runs' own time
        double spentS;  // its blocks' wall time, warm-ups included: what the cap counts
        final JSONArray blocks = new JSONArray();
        String stopped;  // "interval" | "cap" | "runs"; "error" where its timer gave up on it

        Tally(int heads) {
            this.heads = heads;
        }

        void add(int round, double[] latenciesS, double spent) throws JSONException {
            JSONArray ms = new JSONArray();
            double sum = 0.0;  // the block's sum first, then the total, as calibration_plan's Tally adds them
            for (double v : latenciesS) {
                int at = Collections.binarySearch(sortedS, v);
                sortedS.add(at < 0 ? -at - 1 : at, v);
                sum += v;
                ms.put(Math.round(v * 1e8) / 1e5);  // ms to 10 ns, as the record keeps them
            }
            timedS += sum;
            spentS += spent;
            JSONObject block = new JSONObject();
            block.put("round", round);
            block.put("latencies_ms", ms);
            block.put("spent_s", spent);
            blocks.put(block);
        }

        double[] intervalS() {
            int[] ranks = orderRanks(sortedS.size(), Q, LOOK_LEVEL);
            return ranks == null ? null : new double[] {sortedS.get(ranks[0]), sortedS.get(ranks[1])};
        }

        boolean tight(double within) {
            double[] interval = intervalS();
            if (interval == null) return false;
            double p90 = Latency.percentile(sorted(), 90);
            return p90 - interval[0] <= within * p90 && interval[1] - p90 <= within * p90;
        }

        /** Stop once the interval is tight (after the floors), the cap is spent or the most runs kept are timed. */
        String judge(Plan plan) {
            if (stopped != null || sortedS.isEmpty()) return stopped;
            if (sortedS.size() >= plan.minRuns && timedS >= plan.minS && tight(plan.within)) {
                stopped = "interval";
            } else if (spentS >= plan.capS) {
                stopped = "cap";
            } else if (sortedS.size() >= MAX_TIMED_RUNS) {
                stopped = "runs";
            }
            return stopped;
        }

        double[] sorted() {
            double[] s = new double[sortedS.size()];
            for (int i = 0; i < s.length; i++) s[i] = sortedS.get(i);
            return s;
        }

        /** The result's latency (ms) with the p90's interval (null ends: too few runs) and the timed seconds. */
        JSONObject latency() throws JSONException {
            double[] ms = sorted();
            for (int i = 0; i < ms.length; i++) ms[i] *= 1e3;
            JSONObject o = Latency.summarize(ms);
            double[] interval = intervalS();
            o.put("p90_low_ms", interval == null ? JSONObject.NULL : (Object) (interval[0] * 1e3));
            o.put("p90_high_ms", interval == null ? JSONObject.NULL : (Object) (interval[1] * 1e3));
            o.put("timed_s", timedS);
            return o;
        }
    }

    /** Reads the phone's state as the result lines carry it (Signals.Reading.toStateJson). */
    interface State {
        JSONObject read() throws JSONException;
    }

    /**
     * Waits, before each round, for the phone to be back in the thermal state the calibration began in: its
     * hottest reading within {@link Plan#gateMarginC} of the start's, its thermal status no higher, its headroom
     * forecast at most {@link Plan#gateHeadroom} (or the start's); at most {@link Plan#gateMaxWaitS}. A phone
     * with none of them is not gated and says so; a signal lost after the start is not waited on.
     */
    static final class Gate {
        static final String[] KEYS = {"max_temp_c", "android_thermal_status", "android_thermal_headroom"};
        private final Plan plan;
        private final State state;
        private final Map<String, Double> start;

        Gate(Plan plan, State state) throws JSONException {
            this.plan = plan;
            this.state = state;
            this.start = signals(state.read());
        }

        static Map<String, Double> signals(JSONObject s) {
            Map<String, Double> found = new TreeMap<String, Double>();
            for (String key : KEYS) {
                Object v = s.opt(key);
                if (v instanceof Number && !Double.isNaN(((Number) v).doubleValue())
                        && !Double.isInfinite(((Number) v).doubleValue())) {
                    found.put(key, ((Number) v).doubleValue());
                }
            }
            return found;
        }

        /** Why the phone is not back in its start state (null: it is); a signal it lost is named in Lost. */
        private String tooHot(Map<String, Double> now) throws Lost {
            for (String key : start.keySet()) if (!now.containsKey(key)) throw new Lost(key);
            if (start.containsKey("max_temp_c") && now.get("max_temp_c") > start.get("max_temp_c") + plan.gateMarginC) {
                return String.format(Locale.ROOT, "%.1f °C, over %.1f + %s", now.get("max_temp_c"), start.get("max_temp_c"),
                        g(plan.gateMarginC));
            }
            if (start.containsKey("android_thermal_status")
                    && now.get("android_thermal_status") > start.get("android_thermal_status")) {
                return "thermal status " + g(now.get("android_thermal_status")) + ", over "
                        + g(start.get("android_thermal_status"));
            }
            double limit = Math.max(plan.gateHeadroom, start.containsKey("android_thermal_headroom")
                    ? start.get("android_thermal_headroom") : plan.gateHeadroom);
            if (start.containsKey("android_thermal_headroom") && now.get("android_thermal_headroom") > limit) {
                return String.format(Locale.ROOT, "headroom %.2f, over %.2f", now.get("android_thermal_headroom"), limit);
            }
            return null;
        }

        /** Wait until the phone is back (or the longest wait passed); the record of the wait. */
        JSONObject await() throws JSONException, InterruptedException {
            JSONObject wait = new JSONObject();
            if (start.isEmpty()) {
                wait.put("waited_s", 0.0);
                wait.put("outcome", "ungated");
                wait.put("why", "the device reports no temperature");
                return wait;
            }
            long began = System.nanoTime();
            while (true) {
                Map<String, Double> now = signals(state.read());
                double waited = (System.nanoTime() - began) / 1e9;
                String why;
                try {
                    why = tooHot(now);
                } catch (Lost e) {
                    wait.put("waited_s", waited);
                    wait.put("outcome", "reading failed");
                    wait.put("why", "the device no longer reports " + e.getMessage());
                    wait.put("state", new JSONObject(now));
                    return wait;
                }
                if (why == null || waited >= plan.gateMaxWaitS) {
                    wait.put("waited_s", waited);
                    wait.put("outcome", why == null ? "ready" : "timeout");
                    if (why != null) wait.put("why", why);
                    wait.put("state", new JSONObject(now));
                    return wait;
                }
                Thread.sleep((long) (Math.min(plan.gatePollS, plan.gateMaxWaitS - waited) * 1000));
            }
        }

        static final class Lost extends Exception {
            Lost(String key) {
                super(key);
            }
        }
    }

    /** Times one block of a head count: its latencies in seconds (empty when it failed and has stopped). */
    interface Timer {
        double[] block(int heads) throws Exception;
    }

    /** Told each round before its blocks, and each tally after its block (judged: stopped once done). */
    interface Listener {
        void round(JSONObject round) throws Exception;

        void block(Tally tally) throws Exception;
    }

    /**
     * Time every open tally in rounds until each has stopped (calibration_plan.interleave): each round waits on
     * the gate, then visits the open head counts in a new random order, a block each.
     */
    static void interleave(Map<Integer, Tally> tallies, Timer timer, Plan plan, Random random, Gate gate,
                           Listener listener) throws Exception {
        long began = System.nanoTime();
        for (int round = plan.firstRound; ; round++) {
            List<Integer> order = new ArrayList<Integer>();
            for (Map.Entry<Integer, Tally> e : new TreeMap<Integer, Tally>(tallies).entrySet()) {
                if (e.getValue().stopped == null) order.add(e.getKey());
            }
            if (order.isEmpty()) return;
            Collections.shuffle(order, random);
            JSONObject r = new JSONObject();
            r.put("event", "round");
            r.put("round", round);
            r.put("order", new JSONArray(order));
            r.put("started_s", (System.nanoTime() - began) / 1e9);
            r.put("gate", gate.await());
            listener.round(r);
            for (int heads : order) {
                long start = System.nanoTime();
                double[] latencies = timer.block(heads);
                Tally tally = tallies.get(heads);
                if ("error".equals(tally.stopped)) continue;  // reported as it failed
                tally.add(round, latencies, (System.nanoTime() - start) / 1e9);
                tally.judge(plan);
                listener.block(tally);
            }
        }
    }

    /** Step is one inference of the head count being timed. */
    interface Step {
        void run() throws Exception;
    }

    /** {@code warmup} untimed runs, then runs until at least MIN_BLOCK_RUNS and {@code blockS} of them. */
    static double[] timedBlock(Step step, int warmup, double blockS) throws Exception {
        for (int i = 0; i < warmup; i++) step.run();
        List<Double> latencies = new ArrayList<Double>();
        double sum = 0;
        while (latencies.size() < MIN_BLOCK_RUNS || sum < blockS) {
            long t = System.nanoTime();
            step.run();
            double s = (System.nanoTime() - t) / 1e9;
            latencies.add(s);
            sum += s;
        }
        double[] out = new double[latencies.size()];
        for (int i = 0; i < out.length; i++) out[i] = latencies.get(i);
        return out;
    }
}
