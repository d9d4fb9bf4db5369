package org.hydraedge.demo;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;

import org.json.JSONArray;
import org.json.JSONObject;

/**
 * The bench mode's plan (Rounds) on given inputs, for the tests to hold against hydra_edge/calibration_plan.py:
 * the interval's ranks for every run count up to a bound, and each case's blocks fed to a Tally with the stop
 * rule judged after each. usage: PlanMain CASES.json (printing one JSON object)
 * CASES: {"ranks_up_to": N, "levels": [0.97, ...], "cases": [{"plan": {...}, "min_runs": R,
 * "blocks": [{"latencies_s": [...], "spent_s": S}, ...]}, ...]}
 * printed: {"ranks": {"0.97": [[lo, hi] or null for n = 0..N], ...}, "cases": [{"stopped": [per block],
 * "latency": {...}}, ...]}
 */
public final class PlanMain {
    private PlanMain() {
    }

    public static void main(String[] args) throws Exception {
        JSONObject in = new JSONObject(new String(Files.readAllBytes(new File(args[0]).toPath()), StandardCharsets.UTF_8));
        JSONObject ranks = new JSONObject();
        JSONArray levels = in.getJSONArray("levels");
        for (int l = 0; l < levels.length(); l++) {
            JSONArray byN = new JSONArray();
            for (int n = 0; n <= in.getInt("ranks_up_to"); n++) {
                int[] r = Rounds.orderRanks(n, Rounds.Q, levels.getDouble(l));
                byN.put(r == null ? JSONObject.NULL : new JSONArray(new int[] {r[0], r[1]}));
            }
            ranks.put(levels.getString(l), byN);
        }
        JSONArray out = new JSONArray();
        JSONArray cases = in.getJSONArray("cases");
        for (int c = 0; c < cases.length(); c++) {
            JSONObject one = cases.getJSONObject(c);
            Rounds.Plan plan = Rounds.Plan.of(one.getInt("min_runs"), one.getJSONObject("plan"));
            Rounds.Tally tally = new Rounds.Tally(3);
            JSONArray stopped = new JSONArray();
            JSONArray blocks = one.getJSONArray("blocks");
            for (int b = 0; b < blocks.length(); b++) {
                JSONObject block = blocks.getJSONObject(b);
                JSONArray lat = block.getJSONArray("latencies_s");
                double[] s = new double[lat.length()];
                for (int i = 0; i < s.length; i++) s[i] = lat.getDouble(i);
                tally.add(b + 1, s, block.getDouble("spent_s"));
                String why = tally.judge(plan);
                stopped.put(why == null ? JSONObject.NULL : why);
            }
            JSONObject result = new JSONObject();
            result.put("stopped", stopped);
            result.put("latency", tally.latency());
            out.put(result);
        }
        JSONObject printed = new JSONObject();
        printed.put("ranks", ranks);
        printed.put("cases", out);
        System.out.println(printed.toString());
    }
}
