package org.hydraedge.demo;

import java.util.Arrays;

import org.json.JSONException;
import org.json.JSONObject;

/** hydra_edge.runtime.latency.summarize_latencies in Java: the same fields, the same percentiles (ms). */
final class Latency {
    private Latency() {}

    static double percentile(double[] sorted, double q) {
        double position = (sorted.length - 1) * (q / 100.0);  // as Python groups it: the same rounding
        int low = (int) Math.floor(position);
        int high = (int) Math.ceil(position);
        double weight = position - low;
        double a = sorted[low];
        double b = sorted[high];
        // numpy's two-sided form (latency.percentile): never outside [a, b], so equal timings are their own p90
        return weight >= 0.5 ? b - (b - a) * (1.0 - weight) : a + (b - a) * weight;
    }

    static JSONObject summarize(double[] ms) throws JSONException {
        double[] s = ms.clone();
        Arrays.sort(s);
        double sum = 0;
        for (double v : s) sum += v;
        double mean = sum / s.length;
        double var = 0;
        for (double v : s) var += (v - mean) * (v - mean);
        int cut = (int) (0.1 * s.length);
        double trimmed = 0;
        for (int i = cut; i < s.length - cut; i++) trimmed += s[i];
        trimmed /= (s.length - 2 * cut);
        JSONObject o = new JSONObject();
        o.put("count", s.length);
        o.put("mean_ms", mean);
        o.put("std_ms", Math.sqrt(var / s.length));
        o.put("min_ms", s[0]);
        o.put("max_ms", s[s.length - 1]);
        o.put("p50_ms", percentile(s, 50));
        o.put("p90_ms", percentile(s, 90));
        o.put("p99_ms", percentile(s, 99));
        o.put("trimmed_mean_ms", trimmed);
        return o;
    }
}
