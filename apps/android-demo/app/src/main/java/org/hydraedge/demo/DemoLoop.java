package org.hydraedge.demo;

import org.json.JSONException;
import org.json.JSONObject;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The demo without its views: each step takes a reading, lets the switcher pick the head count (a program that
 * cannot run: fewer heads, see {@link Engines#choose}), classifies the next held-out image the bundle carries in
 * that head count's engine, and gives the switcher the inference's time (its latency loop). MainActivity draws
 * each {@link Frame}; a desktop JVM runs the same steps in the APK's runtime.
 */
final class DemoLoop {
    static final int WINDOW = 50;  // inferences per head count kept for p50/p90

    /** One step's outcome, what the screen shows. */
    static final class Frame {
        final int heads;
        /** Which golden image (0-based) of how many. */
        final int image;
        final int images;
        final int predicted;
        /** What the fp32 model says for that image. */
        final int expected;
        final double ms;
        /** p50/p90 of this head count's last {@link #WINDOW} inferences (Latency.summarize). */
        final JSONObject latency;
        /** The latency loop's budget now, or NaN without one. */
        final double budgetMs;

        Frame(int heads, int image, int images, int predicted, int expected, double ms, JSONObject latency, double budgetMs) {
            this.heads = heads;
            this.image = image;
            this.images = images;
            this.predicted = predicted;
            this.expected = expected;
            this.ms = ms;
            this.latency = latency;
            this.budgetMs = budgetMs;
        }
    }

    private final BundleStore bundle;
    private final HeadSwitch sw;
    private final Engines engines;
    private final Map<Integer, List<Double>> times = new HashMap<Integer, List<Double>>();
    private int image;

    DemoLoop(BundleStore bundle, HeadSwitch sw, Engines engines) {
        this.bundle = bundle;
        this.sw = sw;
        this.engines = engines;
    }

    /** One image at the head count the switcher picks for {@code r}; Refused when not even the fewest heads run. */
    Frame step(Signals.Reading r) throws BundleStore.Refused, InterruptedException, IOException, JSONException {
        Engine engine = engines.choose(sw, r);
        int heads = engine.heads;
        BundleStore.Artefact a = bundle.byHeads(heads);
        Map<String, Npy> golden = Npy.readNpz(bundle.file(a.golden));
        Npy inputs = a.goldenInputs != null ? Npy.readNpz(bundle.goldenInputs(a)).get("inputs") : golden.get("inputs");
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
        return new Frame(heads, i, inputs.rows(), Engine.argmax(logits), Engine.argmax(reference.row(i)), ms,
                Latency.summarize(w), sw.budgetMs(r));
    }
}
