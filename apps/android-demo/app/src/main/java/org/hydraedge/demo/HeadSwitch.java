package org.hydraedge.demo;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * The one place the Activity asks which head count to run: the adapter to the switcher library
 * (apps/android-demo/core, org.hydraedge.core). The Activity uses only these four calls:
 *
 *   HeadSwitch.open(bundleDir)                 the bundle's lut.json, checked against its manifest
 *   int poll(Signals.Reading r)                read the signals once; the head count to run now
 *   void observe(int heads, double ms)         one single-image inference's time
 *   String lastReason()                        why the head count last changed ("start", "state: ...")
 *   double budgetMs(Signals.Reading r)         the latency budget now (lut.json budget_ms x battery scale)
 *
 * Wiring the library: poll maps to org.hydraedge.core.Switcher.poll(new AndroidReading(thermalStatus,
 * thermalHeadroom, batteryLevel, batteryStatus)), observe to Switcher.observe(heads, ms), lastReason to the
 * last of Switcher.reasons(1), budgetMs to Table.budget(batteryPct, charging). Until then this stand-in
 * follows the table's cells (battery band x thermal band, fewer heads at once, more only after the
 * table's min_dwell_s) without the library's fail-safe holds or latency loop.
 */
final class HeadSwitch {
    private final int[] heads;
    private final int[][] cells;
    private final double[] thermalEdges;
    private final double[] batteryMinPct;
    private final double[] budgetScale;
    private final double budgetMs;
    private final double minDwellS;
    private int running = -1;
    private long switchedAtMs;
    private String reason = "start";

    private HeadSwitch(JSONObject lut) throws JSONException {
        JSONArray c = lut.getJSONArray("candidates");
        heads = new int[c.length()];
        for (int i = 0; i < heads.length; i++) heads[i] = c.getJSONObject(i).getInt("heads");
        JSONArray rows = lut.getJSONObject("selection").getJSONArray("cells");
        cells = new int[rows.length()][];
        for (int i = 0; i < cells.length; i++) {
            JSONArray row = rows.getJSONArray(i);
            cells[i] = new int[row.length()];
            for (int j = 0; j < row.length(); j++) cells[i][j] = row.getInt(j);
        }
        thermalEdges = doubles(lut.getJSONObject("thermal").getJSONArray("edges"));
        JSONObject battery = lut.getJSONObject("battery");
        batteryMinPct = doubles(battery.getJSONArray("min_pct"));
        budgetScale = doubles(battery.getJSONArray("budget_scale"));
        budgetMs = lut.optDouble("budget_ms", Double.NaN);
        minDwellS = lut.getJSONObject("selection").optDouble("min_dwell_s", 0);
    }

    static HeadSwitch open(BundleStore bundle) throws BundleStore.Refused {
        try {
            return new HeadSwitch(bundle.lut);
        } catch (JSONException e) {
            throw new BundleStore.Refused("lut.json is not a table hydra-edge lut writes (" + e.getMessage()
                    + "); run hydra-edge lut for this bundle");
        }
    }

    private static double[] doubles(JSONArray a) throws JSONException {
        double[] out = new double[a.length()];
        for (int i = 0; i < out.length; i++) out[i] = a.getDouble(i);
        return out;
    }

    private int batteryBand(Signals.Reading r) {
        if (r.batteryPercent == null) return batteryMinPct.length;  // unknown: the lowest band
        if (Boolean.TRUE.equals(r.charging)) return 0;
        for (int i = 0; i < batteryMinPct.length; i++) {
            if (r.batteryPercent >= batteryMinPct[i]) return i + 1;
        }
        return batteryMinPct.length;
    }

    private int thermalBand(Signals.Reading r) {
        if (r.thermalStatus == null) return thermalEdges.length;  // unknown: the hottest band
        int band = 0;
        for (double edge : thermalEdges) {
            if (r.thermalStatus >= edge) band++;
        }
        return band;
    }

    int poll(Signals.Reading r) {
        int want = cells[batteryBand(r)][thermalBand(r)];
        long now = r.timestampMs;
        String why = "state: battery " + (r.batteryPercent == null ? "unknown" : r.batteryPercent + " %")
                + (Boolean.TRUE.equals(r.charging) ? " charging" : "") + ", thermal "
                + (r.thermalStatus == null ? "unknown" : r.thermalName());
        if (running < 0) {
            running = want;
            switchedAtMs = now;
            reason = "start: " + why;
        } else if (want < running || (want > running && (now - switchedAtMs) / 1000.0 >= minDwellS)) {
            running = want;
            switchedAtMs = now;
            reason = why;
        }
        return heads[running];
    }

    void observe(int ranHeads, double ms) {
        // the library's latency loop caps the head count on missed budgets; the stand-in only shows them
    }

    String lastReason() {
        return reason;
    }

    double budgetMs(Signals.Reading r) {
        int band = batteryBand(r);
        return band < budgetScale.length ? budgetMs * budgetScale[band] : budgetMs;
    }
}
