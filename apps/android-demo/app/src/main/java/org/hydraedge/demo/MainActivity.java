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
        final String plan = getIntent().getStringExtra("plan");  // --es plan JSON: calibrate's rounds settings
        running = true;
        work.post(new Runnable() {
            @Override
            public void run() {
                if (bench) runBench(runs, warmup, threads, only, plan);
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

    private void runBench(int runs, int warmup, int threads, String[] only, String plan) {
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
        Engines engines = null;
        try {
            BundleStore bundle;
            try {
                bundle = BundleStore.open(this);
            } catch (BundleStore.Refused e) {
                bench.fatal(e.getMessage());
                refuse(e.getMessage());
                return;
            }
            engines = new Engines(bundle, new ServiceProber(this));
            String summary = bench.run(bundle, engines, Bench.phone(), only, runs, warmup, threads,
                    plan, new Bench.Progress() {
                @Override
                public void timing(String artefact, String done) {
                    show("benchmark: " + artefact, Color.BLACK, done);
                }
            });
            show("benchmark done", Color.rgb(0, 128, 0), summary + "\n" + file);
        } catch (BundleStore.Refused e) {  // --esa only named an artefact the bundle lacks, or --es plan is no plan: its fatal line is written
            refuse(e.getMessage());
        } catch (Exception e) {
            show("benchmark failed", Color.RED, String.valueOf(e));
        } finally {
            if (engines != null) engines.close();
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
            sw = HeadSwitch.open(bundle, Signals.readsHeadroom());
        } catch (BundleStore.Refused e) {
            refuse(e.getMessage());
            return;
        }
        Signals signals = new Signals(this);
        Engines engines = new Engines(bundle, new ServiceProber(this));
        DemoLoop demo = new DemoLoop(bundle, sw, engines);
        JSONArray classes = bundle.manifest.optJSONArray("classes");
        try {
            while (running) {
                Signals.Reading r = signals.read();
                DemoLoop.Frame f;
                try {
                    f = demo.step(r);
                } catch (BundleStore.Refused e) {  // not even the fewest heads can run
                    refuse(e.getMessage());
                    return;
                }
                JSONObject lat = f.latency;
                String name = classes != null && f.predicted < classes.length() ? classes.getString(f.predicted)
                        : "class " + f.predicted;
                StringBuilder s = new StringBuilder();
                s.append(String.format("latency  p50 %.2f ms  p90 %.2f ms  (budget %.1f ms)%n", lat.getDouble("p50_ms"),
                        lat.getDouble("p90_ms"), f.budgetMs));
                s.append("image    ").append(f.image + 1).append('/').append(f.images).append(": ").append(name)
                        .append(f.predicted == f.expected ? "  (as fp32)" : "  (fp32 says " + f.expected + ")").append('\n');
                s.append("thermal  ").append(r.thermalStatus == null ? "unknown" : r.thermalName())
                        .append(Float.isNaN(r.thermalHeadroom) ? "" : String.format("  headroom %.2f (%.1f s ago)",
                                r.thermalHeadroom, r.headroomAgeMs / 1000.0)).append('\n');
                s.append("battery  ").append(r.batteryPercent == null ? "unknown" : r.batteryPercent + " %")
                        .append(Boolean.TRUE.equals(r.charging) ? " charging" : "").append('\n');
                if (engines.lastFailure != null) s.append("failed   ").append(engines.lastFailure).append('\n');
                s.append("switches (newest last, as the switcher library words them)\n");
                for (String line : sw.recent(SHOWN_SWITCHES)) s.append("  ").append(line).append('\n');
                s.append("bundle   ").append(bundle.manifestSha256.substring(0, 12)).append("  lut ")
                        .append(bundle.lutSha256.substring(0, 12)).append('\n');
                show(f.heads + " heads", f.budgetMs >= lat.getDouble("p90_ms") || Double.isNaN(f.budgetMs)
                        ? Color.rgb(0, 128, 0) : Color.rgb(200, 120, 0), s.toString());
                Thread.sleep(PAUSE_MS);
            }
        } catch (Exception e) {
            show("stopped", Color.RED, String.valueOf(e));
        } finally {
            engines.close();
            sw.close();
        }
    }
}
