package org.hydraedge.demo;

import android.os.Build;
import android.util.Log;

import org.json.JSONException;
import org.json.JSONObject;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;

/**
 * Benchmark mode (adb shell am start -n org.hydraedge.demo/.MainActivity --es mode bench): times every
 * artefact of the bundle by the plan calibration/runner.py follows ({@link Rounds}) and writes the JSON lines it
 * prints, one object per line ("device" first, "loaded", "round", "block" and "result" lines, "done" last, or
 * "fatal"), to bench.jsonl in the app's
 * external files folder, where adb pull reaches it. Each line is also logged under the tag hydra-edge.
 * Everything but the phone's identity ({@link #phone}) and its readings ({@link Readings}) is plain Java, so
 * the same run happens on a desktop JVM in the APK's runtime.
 */
final class Bench {
    static final String FILE = "bench.jsonl";
    private final Writer out;
    private final Readings signals;

    /** Told before each artefact is timed: its id, and the summary of those timed so far (for the screen). */
    interface Progress {
        void timing(String artefact, String summary);
    }

    Bench(File file, Readings signals) throws IOException {
        this.out = new OutputStreamWriter(new FileOutputStream(file), "UTF-8");
        this.signals = signals;
    }

    /**
     * Bench mode: the artefacts {@code only} names (all when null) checked against their golden pairs and loaded
     * one after another ("loaded", or a "result" for one that cannot be timed), then timed in rounds as
     * {@link Rounds} plans them ("round" and "block" lines, and each head count's "result" as its timing stops),
     * a "device" line first ({@code device}: what {@link #phone} says on a phone) and "done" last. Returns the
     * summary shown at the end; a {@code only} naming an artefact the bundle lacks, or a {@code planText} (the
     * rounds' settings as JSON; null: the defaults) that is not a plan, is a "fatal" line and Refused.
     */
    String run(BundleStore bundle, Engines engines, JSONObject device, String[] only, int runs, int warmup, int threads,
               String planText, Progress progress) throws Exception {
        List<BundleStore.Artefact> timed;
        Rounds.Plan plan;
        try {
            timed = artefacts(bundle.artefacts, only);
            try {
                plan = Rounds.Plan.of(runs, planText == null ? null : new JSONObject(planText));
            } catch (JSONException e) {
                throw new BundleStore.Refused("bench mode's plan is not one calibrate sends (" + e.getMessage()
                        + "); start it with hydra-edge calibrate --runner app");
            }
        } catch (BundleStore.Refused e) {
            fatal(e.getMessage());
            throw e;
        }
        emit(deviceRecord(device));
        Rounds.Gate gate = new Rounds.Gate(plan, new Rounds.State() {
            @Override
            public JSONObject read() throws JSONException {
                return signals.read().toStateJson();
            }
        });
        final StringBuilder text = new StringBuilder();
        final Map<Integer, Loaded> ready = new TreeMap<Integer, Loaded>();
        for (BundleStore.Artefact a : timed) {
            progress.timing(a.id, text.toString());
            Loaded loaded = null;
            try {
                loaded = prepare(bundle, engines, a, warmup, Engines.threadsFor(a, threads));
            } catch (Throwable e) {  // this artefact cannot run here; the others may
                JSONObject r = result(a);
                r.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                say(text, r);
                continue;
            }
            if (loaded.engine == null) {  // its outputs are outside tolerance: reported, not timed
                say(text, loaded.result);
                continue;
            }
            ready.put(a.heads, loaded);
            JSONObject line = new JSONObject();
            line.put("event", "loaded");
            line.put("heads", a.heads);
            line.put("artefact", a.id);
            emit(line);
        }
        final Map<Integer, Rounds.Tally> tallies = new TreeMap<Integer, Rounds.Tally>();
        for (int heads : ready.keySet()) tallies.put(heads, new Rounds.Tally(heads));
        final Rounds.Plan rule = plan;
        try {
            Rounds.interleave(tallies, new Rounds.Timer() {
                @Override
                public double[] block(int heads) throws Exception {
                    final Loaded item = ready.get(heads);
                    try {
                        return Rounds.timedBlock(new Rounds.Step() {
                            @Override
                            public void run() throws Exception {
                                item.engine.run(item.x, item.shape);
                            }
                        }, rule.blockWarmup, rule.blockS);
                    } catch (Throwable e) {  // it cannot run any more; the others may
                        tallies.get(heads).stopped = "error";
                        item.result.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                        item.close();
                        say(text, item.result);
                        return new double[0];
                    }
                }
            }, plan, new Random(), gate, new Rounds.Listener() {
                @Override
                public void round(JSONObject round) throws Exception {
                    emit(round);
                }

                @Override
                public void block(Rounds.Tally tally) throws Exception {
                    Loaded item = ready.get(tally.heads);
                    JSONObject line = new JSONObject();
                    line.put("event", "block");
                    line.put("heads", tally.heads);
                    line.put("artefact", item.artefact.id);
                    line.put("sha256", item.artefact.sha256);
                    line.put("runner", "app");
                    line.put("block", tally.blocks.getJSONObject(tally.blocks.length() - 1));
                    emit(line);
                    if (tally.stopped != null) finish(item, tally, text);
                }
            });
        } finally {
            for (Loaded item : ready.values()) item.close();
        }
        JSONObject done = new JSONObject();
        done.put("event", "done");
        emit(done);
        return text.toString();
    }

    /** Emit a result line and add its head count's line to the summary shown on the screen. */
    private void say(StringBuilder text, JSONObject r) throws Exception {
        emit(r);
        JSONObject lat = r.optJSONObject("latency");
        text.append(r.getInt("heads")).append(" heads: ").append(r.getString("status"))
                .append(lat == null ? "" : String.format(Locale.ROOT, " p50 %.2f ms p90 %.2f ms",
                        lat.getDouble("p50_ms"), lat.getDouble("p90_ms"))).append('\n');
    }

    /** A head count whose timing stopped: its result line, and its engine released. */
    private void finish(Loaded item, Rounds.Tally tally, StringBuilder text) throws Exception {
        JSONObject r = item.result;
        r.put("status", "ok");
        r.put("latency", tally.latency());
        r.put("stopped", tally.stopped);
        r.put("blocks", tally.blocks);
        Double rss = peakRssMb();
        r.put("peak_rss_mb", rss == null ? JSONObject.NULL : rss);
        r.put("state_after", signals.read().toStateJson());
        item.close();
        say(text, r);
    }

    /** An artefact checked and loaded, ready for its blocks; engine null when its golden check failed. */
    static final class Loaded {
        final BundleStore.Artefact artefact;
        final JSONObject result;
        Engine engine;
        float[] x;
        long[] shape;

        Loaded(BundleStore.Artefact artefact, JSONObject result) {
            this.artefact = artefact;
            this.result = result;
        }

        void close() {
            if (engine != null) engine.close();
            engine = null;
        }
    }

    /** The line that ends a run before anything was timed: the bundle or the request cannot be run. */
    void fatal(String message) throws IOException, JSONException {
        JSONObject fatal = new JSONObject();
        fatal.put("event", "fatal");
        fatal.put("message", message);
        emit(fatal);
    }

    /**
     * The artefacts bench mode times: every one the bundle holds, or those {@code only} names in the bundle's
     * order (calibration/runner.py's --only; a resumed calibration asks for what it lacks).
     */
    static List<BundleStore.Artefact> artefacts(List<BundleStore.Artefact> all, String[] only)
            throws BundleStore.Refused {
        if (only == null) return all;
        Map<String, BundleStore.Artefact> byId = new HashMap<String, BundleStore.Artefact>();
        for (BundleStore.Artefact a : all) byId.put(a.id, a);
        for (String id : only) {
            if (!byId.containsKey(id)) {
                throw new BundleStore.Refused("bench mode was asked for artefact '" + id + "', which the app's bundle "
                        + "does not hold; calibrate the bundle the APK was built from");
            }
        }
        List<String> wanted = Arrays.asList(only);
        List<BundleStore.Artefact> picked = new ArrayList<BundleStore.Artefact>();
        for (BundleStore.Artefact a : all) if (wanted.contains(a.id)) picked.add(a);
        return picked;
    }

    void emit(JSONObject event) throws IOException {
        String line = event.toString();
        out.write(line + "\n");
        out.flush();
        Log.i("hydra-edge", line);
    }

    void close() throws IOException {
        out.close();
    }

    /** What the phone says it is (android.os.Build), with the device line's keys. */
    static JSONObject phone() throws JSONException {
        JSONObject d = new JSONObject();
        d.put("model", Build.MANUFACTURER + " " + Build.MODEL);
        d.put("cpu_model", Build.HARDWARE);
        d.put("arch", Build.SUPPORTED_ABIS.length > 0 ? Build.SUPPORTED_ABIS[0] : JSONObject.NULL);
        d.put("cores", Runtime.getRuntime().availableProcessors());
        d.put("os", "Android " + Build.VERSION.RELEASE + " (API " + Build.VERSION.SDK_INT + ")");
        d.put("kernel", System.getProperty("os.version"));
        d.put("python", JSONObject.NULL);
        return d;
    }

    static JSONObject deviceRecord(JSONObject d) throws JSONException {
        JSONObject runtimes = new JSONObject();
        runtimes.put("executorch", MainActivity.EXECUTORCH_RUNTIME);
        JSONObject e = new JSONObject();
        e.put("event", "device");
        e.put("device", d);
        e.put("runtimes", runtimes);
        return e;
    }

    /** A result line for artefact {@code a} that says "error" until the measurement fills it in. */
    static JSONObject result(BundleStore.Artefact a) throws Exception {
        JSONObject r = new JSONObject();
        r.put("event", "result");
        r.put("heads", a.heads);
        r.put("artefact", a.id);
        r.put("sha256", a.sha256);
        r.put("runner", "app");
        r.put("status", "error");
        return r;
    }

    /**
     * One artefact as runner.prepare does it: golden check, load time and warm-up, its engine kept for the rounds.
     * Its program is probed first in the probe's process ({@link Engines#checked}), so one the runtime cannot run
     * is this artefact's error line, not the end of the app; the probe's time is left out of load_s.
     */
    Loaded prepare(BundleStore bundle, Engines engines, BundleStore.Artefact a, int warmup, int threads)
            throws Exception {
        Loaded item = new Loaded(a, result(a));
        JSONObject r = item.result;
        r.put("state_before", signals.read().toStateJson());
        Map<String, Npy> golden = Npy.readNpz(bundle.file(a.golden));
        if (a.goldenInputs != null) golden.put("inputs", Npy.readNpz(bundle.file(a.goldenInputs)).get("inputs"));
        Npy inputs = golden.get("inputs");
        Npy reference = golden.get("reference");
        long start = System.nanoTime();  // load_s: a compact record's rebuild included, as a board's load
        File file = engines.checked(a, threads);
        long probeNs = engines.lastProbeNs;
        Engine engine = Engine.load(a, file, threads);
        boolean kept = false;
        try {
            long[] shape = inputs.shape.clone();
            shape[0] = 1;
            double maxDiff = 0;
            int agree = 0;
            for (int i = 0; i < inputs.rows(); i++) {
                float[] logits = engine.run(inputs.row(i), shape);
                if (i == 0) r.put("load_s", (System.nanoTime() - start - probeNs) / 1e9);  // methods load on first use
                float[] ref = reference.row(i);
                for (int j = 0; j < ref.length; j++) maxDiff = Math.max(maxDiff, Math.abs(logits[j] - ref[j]));
                if (Engine.argmax(logits) == Engine.argmax(ref)) agree++;
            }
            double agreement = (double) agree / inputs.rows();
            boolean ok = maxDiff <= a.maxAbsDiff && agreement >= a.minTop1Agreement;
            JSONObject g = new JSONObject();
            g.put("checked", true);
            g.put("passed", ok);
            g.put("max_abs_diff", maxDiff);
            g.put("top1_agreement", agreement);
            JSONObject tol = new JSONObject();
            tol.put("max_abs_diff", a.maxAbsDiff);
            tol.put("min_top1_agreement", a.minTop1Agreement);
            g.put("tolerance", tol);
            r.put("golden", g);
            if (!ok) {
                r.put("status", "golden_failed");
                r.put("error", "outputs outside tolerance, not timed: max |diff| " + maxDiff + ", top-1 agreement " + agreement);
                return item;
            }
            float[] x = inputs.row(0);
            for (int i = 0; i < warmup; i++) engine.run(x, shape);
            item.engine = engine;
            item.x = x;
            item.shape = shape;
            kept = true;
            return item;
        } finally {
            if (!kept) engine.close();
        }
    }

    /** The process's peak resident memory (VmHWM in /proc/self/status), or null where it cannot be read. */
    static Double peakRssMb() {
        try {
            for (String line : Text.read(new File("/proc/self/status")).split("\n")) {
                if (line.startsWith("VmHWM:")) return Integer.parseInt(line.split("\\s+")[1]) / 1024.0;
            }
        } catch (IOException | RuntimeException e) {
            return null;
        }
        return null;
    }
}
