package org.hydraedge.demo;

import android.app.Activity;
import android.graphics.Color;
import android.os.Bundle;
import android.os.Handler;
import android.os.HandlerThread;
import android.os.Looper;
import android.util.TypedValue;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.TextView;

import org.json.JSONArray;
import org.json.JSONObject;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The hydra-edge demo: the bundle's .pte files in ExecuTorch, the head count chosen by the bundle's
 * lookup table from the phone's thermal status and battery, the held-out images the bundle carries
 * classified one after another. Shows heads, latency p50/p90 against the budget, thermal status and
 * headroom, battery, the predicted class and why the head count last changed. A bundle or table whose
 * sha256 is not the manifest's is refused on screen and nothing runs.
 *
 * Started with --es mode bench it times every artefact instead (see Bench) and writes bench.jsonl;
 * --esa only ID,ID times those artefacts alone.
 */
public class MainActivity extends Activity {
    /** The ExecuTorch runtime the APK carries (recorded in bench.jsonl's device line). */
    static final String EXECUTORCH_RUNTIME = "react-native-executorch 0.8.5 prebuilt (ExecuTorch Android JNI)";
    private static final int WINDOW = 50;  // inferences per head count kept for p50/p90
    private static final long PAUSE_MS = 200;
    private static final int SHOWN_SWITCHES = 5;

    private TextView status;
    private TextView details;
    private HandlerThread worker;
    private Handler work;
    private final Handler ui = new Handler(Looper.getMainLooper());
    private volatile boolean running;

    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        LinearLayout root = new LinearLayout(this);
        root.setOrientation(LinearLayout.VERTICAL);
        int pad = (int) TypedValue.applyDimension(TypedValue.COMPLEX_UNIT_DIP, 16, getResources().getDisplayMetrics());
        root.setPadding(pad, pad, pad, pad);
        status = new TextView(this);
        status.setTextSize(TypedValue.COMPLEX_UNIT_SP, 22);
        details = new TextView(this);
        details.setTextSize(TypedValue.COMPLEX_UNIT_SP, 15);
        details.setTypeface(android.graphics.Typeface.MONOSPACE);
        root.addView(status);
        root.addView(details);
        ScrollView scroll = new ScrollView(this);
        scroll.addView(root);
        setContentView(scroll);
        status.setText("checking the bundle...");

        worker = new HandlerThread("hydra-edge");
        worker.start();
        work = new Handler(worker.getLooper());
        final boolean bench = "bench".equals(getIntent().getStringExtra("mode"));
        final int runs = getIntent().getIntExtra("runs", 50);
        final int warmup = getIntent().getIntExtra("warmup", 10);
        final int threads = getIntent().getIntExtra("threads", 0);
        final String[] only = getIntent().getStringArrayExtra("only");  // --esa only ID,ID: these artefacts alone
        running = true;
        work.post(new Runnable() {
            @Override
            public void run() {
                if (bench) runBench(runs, warmup, threads, only);
                else runDemo();
            }
        });
    }

    @Override
    protected void onDestroy() {
        running = false;
        worker.quitSafely();
        super.onDestroy();
    }

    private void show(final String title, final int color, final String text) {
        ui.post(new Runnable() {
            @Override
            public void run() {
                status.setText(title);
                status.setTextColor(color);
                details.setText(text);
            }
        });
    }

    private void refuse(String why) {
        show("bundle refused", Color.RED, why);
    }

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

    private static int threadsFor(BundleStore.Artefact a, int asked) {
        int cores = Runtime.getRuntime().availableProcessors();
        return Math.min(asked > 0 ? asked : a.threads, cores);
    }

    /**
     * The artefacts bench mode times: every one the bundle holds, or those {@code only} names in the bundle's
     * order (calibration/runner.py's --only; a resumed calibration asks for what it lacks).
     */
    static List<BundleStore.Artefact> benchArtefacts(List<BundleStore.Artefact> all, String[] only)
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

    private void runBench(int runs, int warmup, int threads, String[] only) {
        File dir = getExternalFilesDir(null);
        if (dir == null) dir = getFilesDir();
        File file = new File(dir, Bench.FILE);
        Bench bench;
        try {
            bench = new Bench(file, new Signals(this));
        } catch (IOException e) {
            show("benchmark failed", Color.RED, "cannot write " + file + ": " + e.getMessage());
            return;
        }
        try {
            BundleStore bundle;
            List<BundleStore.Artefact> timed;
            try {
                bundle = BundleStore.open(this);
                timed = benchArtefacts(bundle.artefacts, only);
            } catch (BundleStore.Refused e) {
                JSONObject fatal = new JSONObject();
                fatal.put("event", "fatal");
                fatal.put("message", e.getMessage());
                bench.emit(fatal);
                refuse(e.getMessage());
                return;
            }
            bench.emit(Bench.deviceRecord());
            StringBuilder text = new StringBuilder();
            for (BundleStore.Artefact a : timed) {
                show("benchmark: " + a.id, Color.BLACK, text.toString());
                JSONObject r;
                try {
                    r = bench.measure(bundle, a, runs, warmup, threadsFor(a, threads));
                } catch (Throwable e) {  // this artefact cannot run here; the others may
                    r = Bench.result(a);
                    r.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                }
                bench.emit(r);
                JSONObject lat = r.optJSONObject("latency");
                text.append(a.heads).append(" heads: ").append(r.getString("status"))
                        .append(lat == null ? "" : String.format(" p50 %.2f ms p90 %.2f ms", lat.getDouble("p50_ms"),
                                lat.getDouble("p90_ms"))).append('\n');
            }
            JSONObject done = new JSONObject();
            done.put("event", "done");
            bench.emit(done);
            show("benchmark done", Color.rgb(0, 128, 0), text + "\n" + file);
        } catch (Exception e) {
            show("benchmark failed", Color.RED, String.valueOf(e));
        } finally {
            try {
                bench.close();
            } catch (IOException ignored) {
                // the lines already written were flushed one by one
            }
        }
    }

    private void runDemo() {
        final BundleStore bundle;
        final HeadSwitch sw;
        try {
            bundle = BundleStore.open(this);
            sw = HeadSwitch.open(bundle);
        } catch (BundleStore.Refused e) {
            refuse(e.getMessage());
            return;
        }
        Signals signals = new Signals(this);
        Map<Integer, Engine> engines = new HashMap<Integer, Engine>();
        Map<Integer, List<Double>> times = new HashMap<Integer, List<Double>>();
        JSONArray classes = bundle.manifest.optJSONArray("classes");
        int image = 0;
        String failed = null;  // the last head count that could not be rebuilt or loaded, and why
        try {
            while (running) {
                Signals.Reading r = signals.read();
                int heads = sw.poll(r);
                BundleStore.Artefact a = bundle.byHeads(heads);
                Engine engine = engines.get(heads);
                if (engine == null) {
                    try {
                        engine = Engine.load(a, bundle.artefactFile(a), threadsFor(a, 0));
                    } catch (Exception e) {  // a failed rebuild or load: fewer heads, as on a board
                        String why = oneLine(e);
                        failed = heads + " heads cannot run: " + why;
                        if (!sw.loadFailed(heads, why)) {
                            refuse(failed);
                            return;
                        }
                        continue;
                    }
                    engines.put(heads, engine);
                }
                Map<String, Npy> golden = Npy.readNpz(bundle.file(a.golden));
                Npy inputs = a.goldenInputs != null ? Npy.readNpz(bundle.file(a.goldenInputs)).get("inputs") : golden.get("inputs");
                Npy reference = golden.get("reference");
                int i = image++ % inputs.rows();
                long[] shape = inputs.shape.clone();
                shape[0] = 1;
                long t = System.nanoTime();
                float[] logits = engine.run(inputs.row(i), shape);
                double ms = (System.nanoTime() - t) / 1e6;
                sw.observe(heads, ms);
                List<Double> window = times.get(heads);
                if (window == null) {
                    window = new ArrayList<Double>();
                    times.put(heads, window);
                }
                window.add(ms);
                if (window.size() > WINDOW) window.remove(0);
                double[] w = new double[window.size()];
                for (int k = 0; k < w.length; k++) w[k] = window.get(k);
                JSONObject lat = Latency.summarize(w);
                int predicted = Engine.argmax(logits);
                int expected = Engine.argmax(reference.row(i));
                double budget = sw.budgetMs(r);
                String name = classes != null && predicted < classes.length() ? classes.getString(predicted) : "class " + predicted;
                StringBuilder s = new StringBuilder();
                s.append(String.format("latency  p50 %.2f ms  p90 %.2f ms  (budget %.1f ms)%n", lat.getDouble("p50_ms"),
                        lat.getDouble("p90_ms"), budget));
                s.append("image    ").append(i + 1).append('/').append(inputs.rows()).append(": ").append(name)
                        .append(predicted == expected ? "  (as fp32)" : "  (fp32 says " + expected + ")").append('\n');
                s.append("thermal  ").append(r.thermalStatus == null ? "unknown" : r.thermalName())
                        .append(Float.isNaN(r.thermalHeadroom) ? "" : String.format("  headroom %.2f (%.1f s ago)",
                                r.thermalHeadroom, r.headroomAgeMs / 1000.0)).append('\n');
                s.append("battery  ").append(r.batteryPercent == null ? "unknown" : r.batteryPercent + " %")
                        .append(Boolean.TRUE.equals(r.charging) ? " charging" : "").append('\n');
                if (failed != null) s.append("failed   ").append(failed).append('\n');
                s.append("switches (newest last, as the switcher library words them)\n");
                for (String line : sw.recent(SHOWN_SWITCHES)) s.append("  ").append(line).append('\n');
                s.append("bundle   ").append(bundle.manifestSha256.substring(0, 12)).append("  lut ")
                        .append(bundle.lutSha256.substring(0, 12)).append('\n');
                show(heads + " heads", budget >= lat.getDouble("p90_ms") || Double.isNaN(budget) ? Color.rgb(0, 128, 0)
                        : Color.rgb(200, 120, 0), s.toString());
                Thread.sleep(PAUSE_MS);
            }
        } catch (Exception e) {
            show("stopped", Color.RED, String.valueOf(e));
        } finally {
            for (Engine e : engines.values()) e.close();
            sw.close();
        }
    }

    /** An exception as one line: its message's first line, or its class's name. */
    static String oneLine(Throwable e) {
        String m = e.getMessage();
        if (m == null || m.trim().isEmpty()) return e.getClass().getSimpleName();
        return m.trim().split("\n", 2)[0];
    }
}
