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
import java.util.Map;

/**
 * Benchmark mode (adb shell am start -n org.hydraedge.demo/.MainActivity --es mode bench): times every
 * artefact of the bundle and writes the JSON lines calibration/runner.py prints, one object per line
 * ("device" first, one "result" per artefact, "done" last, or "fatal"), to bench.jsonl in the app's
 * external files folder, where adb pull reaches it. Each line is also logged under the tag hydra-edge.
 */
final class Bench {
    static final String FILE = "bench.jsonl";
    private final Writer out;
    private final Signals signals;

    Bench(File file, Signals signals) throws IOException {
        this.out = new OutputStreamWriter(new FileOutputStream(file), "UTF-8");
        this.signals = signals;
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

    static JSONObject deviceRecord() throws JSONException {
        JSONObject d = new JSONObject();
        d.put("model", Build.MANUFACTURER + " " + Build.MODEL);
        d.put("cpu_model", Build.HARDWARE);
        d.put("arch", Build.SUPPORTED_ABIS.length > 0 ? Build.SUPPORTED_ABIS[0] : JSONObject.NULL);
        d.put("cores", Runtime.getRuntime().availableProcessors());
        d.put("os", "Android " + Build.VERSION.RELEASE + " (API " + Build.VERSION.SDK_INT + ")");
        d.put("kernel", System.getProperty("os.version"));
        d.put("python", JSONObject.NULL);
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

    /** One artefact as runner.measure does it: golden check, then warm-up and timed single-image runs. */
    JSONObject measure(BundleStore bundle, BundleStore.Artefact a, int runs, int warmup, int threads) throws Exception {
        JSONObject r = result(a);
        r.put("state_before", signals.read().toStateJson());
        Map<String, Npy> golden = Npy.readNpz(bundle.file(a.golden));
        if (a.goldenInputs != null) golden.put("inputs", Npy.readNpz(bundle.file(a.goldenInputs)).get("inputs"));
        Npy inputs = golden.get("inputs");
        Npy reference = golden.get("reference");
        long start = System.nanoTime();  // load_s: a compact record's rebuild included, as a board's load
        Engine engine = Engine.load(a, bundle.artefactFile(a), threads);
        try {
            long[] shape = inputs.shape.clone();
            shape[0] = 1;
            double maxDiff = 0;
            int agree = 0;
            for (int i = 0; i < inputs.rows(); i++) {
                float[] logits = engine.run(inputs.row(i), shape);
                if (i == 0) r.put("load_s", (System.nanoTime() - start) / 1e9);  // ExecuTorch loads methods on first use
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
            Double rss = MainActivity.peakRssMb();
            r.put("peak_rss_mb", rss == null ? JSONObject.NULL : rss);
            r.put("state_after", signals.read().toStateJson());
            return r;
        } finally {
            engine.close();
        }
    }
}
