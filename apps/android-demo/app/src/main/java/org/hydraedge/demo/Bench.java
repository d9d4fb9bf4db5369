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
import java.util.Map;

/**
 * Benchmark mode (adb shell am start -n org.hydraedge.demo/.MainActivity --es mode bench): times every
 * artefact of the bundle and writes the JSON lines calibration/runner.py prints, one object per line
 * ("device" first, one "result" per artefact, "done" last, or "fatal"), to bench.jsonl in the app's
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
     * Bench mode: the artefacts {@code only} names (all when null) timed one after another, a "device" line
     * first ({@code device}: what {@link #phone} says on a phone) and "done" last; an artefact that cannot run
     * is its result's error, the others go on. Returns the summary shown at the end; a {@code only} naming an
     * artefact the bundle lacks is a "fatal" line and Refused.
     */
    String run(BundleStore bundle, Engines engines, JSONObject device, String[] only, int runs, int warmup, int threads,
               Progress progress) throws Exception {
        List<BundleStore.Artefact> timed;
        try {
            timed = artefacts(bundle.artefacts, only);
        } catch (BundleStore.Refused e) {
            fatal(e.getMessage());
            throw e;
        }
        emit(deviceRecord(device));
        StringBuilder text = new StringBuilder();
        for (BundleStore.Artefact a : timed) {
            progress.timing(a.id, text.toString());
            JSONObject r;
            try {
                r = measure(bundle, engines, a, runs, warmup, Engines.threadsFor(a, threads));
            } catch (Throwable e) {  // this artefact cannot run here; the others may
                r = result(a);
                r.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            emit(r);
            JSONObject lat = r.optJSONObject("latency");
            text.append(a.heads).append(" heads: ").append(r.getString("status"))
                    .append(lat == null ? "" : String.format(" p50 %.2f ms p90 %.2f ms", lat.getDouble("p50_ms"),
                            lat.getDouble("p90_ms"))).append('\n');
        }
        JSONObject done = new JSONObject();
        done.put("event", "done");
        emit(done);
        return text.toString();
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
     * One artefact as runner.measure does it: golden check, then warm-up and timed single-image runs. Its program
     * is probed first in the probe's process ({@link Engines#checked}), so one the runtime cannot run is this
     * artefact's error line, not the end of the app; the probe's time is left out of load_s.
     */
    JSONObject measure(BundleStore bundle, Engines engines, BundleStore.Artefact a, int runs, int warmup, int threads)
            throws Exception {
        JSONObject r = result(a);
        r.put("state_before", signals.read().toStateJson());
        Map<String, Npy> golden = Npy.readNpz(bundle.file(a.golden));
        if (a.goldenInputs != null) golden.put("inputs", Npy.readNpz(bundle.file(a.goldenInputs)).get("inputs"));
        Npy inputs = golden.get("inputs");
        Npy reference = golden.get("reference");
        long start = System.nanoTime();  // load_s: a compact record's rebuild included, as a board's load
        File file = engines.checked(a, threads);
        long probeNs = engines.lastProbeNs;
        Engine engine = Engine.load(a, file, threads);
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
                return r;
            }
            float[] x = inputs.row(0);
            for (int i = 0; i < warmup; i++) engine.run(x, shape);
            double[] ms = new double[runs];
            for (int i = 0; i < runs; i++) {
                long t = System.nanoTime();
                engine.run(x, shape);
                ms[i] = (System.nanoTime() - t) / 1e6;
            }
            r.put("status", "ok");
            r.put("latency", Latency.summarize(ms));
            Double rss = peakRssMb();
            r.put("peak_rss_mb", rss == null ? JSONObject.NULL : rss);
            r.put("state_after", signals.read().toStateJson());
            return r;
        } finally {
            engine.close();
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
