package org.hydraedge.demo;

import android.util.Log;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import kotlin.jvm.functions.Function0;

import org.hydraedge.core.AndroidReading;
import org.hydraedge.core.LatencyLoop;
import org.hydraedge.core.LoopSettings;
import org.hydraedge.core.Logger;
import org.hydraedge.core.SignalSettings;
import org.hydraedge.core.SwitchEvent;
import org.hydraedge.core.Switcher;

/**
 * The Activity's one door to the switcher library (org.hydraedge.core.Switcher): every decision is
 * the library's, this class only turns Android's readings into its input and its events into text.
 *
 *   HeadSwitch.open(bundle, readsHeadroom)     lut.json checked against the manifest; the latency loop on,
 *                                              its correction saved beside lut.json in the app's files dir
 *   int poll(Signals.Reading r)                Switcher.poll: table, fail-safe holds, raise gate, latency cap
 *   void observe(int heads, double ms)         Switcher.observe: one single-image inference's time
 *   boolean loadFailed(int heads, String why)  Switcher.loadFailed: fewer heads from now on, as on a board
 *   String lastReason()                        the last switch's reason, as the library words it
 *   List<String> recent(int n)                 the last n switches ("12 -> 3 heads: reason")
 *   double budgetMs(Signals.Reading r)         the latency loop's budget now (budget_ms x battery scale)
 */
final class HeadSwitch {
    private static final String TAG = "hydra-edge";
    private static final int KEEP_EVENTS = 100;  // the display shows the last few; the library keeps the rest
    private static final long SAVE_WAIT_S = 5;

    final Switcher switcher;
    /** Where corrections are written: one background thread, so an inference never waits for the disk. */
    private final ExecutorService saver;

    private HeadSwitch(Switcher switcher, ExecutorService saver) {
        this.switcher = switcher;
        this.saver = saver;
    }

    /** {@code readsHeadroom}: whether this phone forecasts its thermal headroom (Signals.readsHeadroom()). */
    static HeadSwitch open(BundleStore bundle, boolean readsHeadroom) throws BundleStore.Refused {
        ExecutorService saver = Executors.newSingleThreadExecutor();
        Function0<Double> monotonic = new Function0<Double>() {
            @Override
            public Double invoke() {
                return System.nanoTime() / 1e9;
            }
        };
        Function0<Double> wall = new Function0<Double>() {
            @Override
            public Double invoke() {
                return System.currentTimeMillis() / 1e3;
            }
        };
        Logger log = new Logger() {
            @Override
            public void log(String level, String message) {
                if ("WARNING".equals(level)) Log.w(TAG, message);
                else Log.i(TAG, message);
            }
        };
        try {
            // the thermal headroom forecast is API 30's; an older phone does not name it, so it plays no part
            SignalSettings settings = new SignalSettings().namingHeadroom(readsHeadroom);
            Switcher s = Switcher.Companion.open(bundle.dir, settings, monotonic,
                    new File(bundle.dir, BundleStore.ASSET_LUT), new LoopSettings(), wall, log, (Executor) saver);
            if (s.getTable().getThermalHeadroom() && !readsHeadroom) {
                log.log("WARNING", "this phone cannot forecast its thermal headroom (PowerManager.getThermalHeadroom, "
                        + "API 30+): the table's headroom plays no part, the thermal status alone counts");
            }
            return new HeadSwitch(s, saver);
        } catch (Exception e) {  // BundleException (Kotlin declares no checked exceptions), IllegalArgumentException
            saver.shutdown();
            throw new BundleStore.Refused(String.valueOf(e.getMessage()));
        }
    }

    int poll(Signals.Reading r) {
        int heads = switcher.poll(new AndroidReading(r.thermalStatus,
                Float.isNaN(r.thermalHeadroom) ? Double.NaN : (double) r.thermalHeadroom, r.batteryPercent, r.batteryStatusCode));
        trim();
        return heads;
    }

    void observe(int heads, double ms) {
        switcher.observe(heads, ms);
        trim();
    }

    /** The app could not rebuild or load {@code heads}' artefact; false when nothing fewer is left. */
    boolean loadFailed(int heads, String why) {
        return switcher.loadFailed(heads, why);
    }

    String lastReason() {
        List<String> last = switcher.reasons(1);
        return last.isEmpty() ? "" : last.get(0);
    }

    List<String> recent(int n) {
        List<SwitchEvent> events = switcher.getEvents();
        List<String> out = new ArrayList<String>();
        for (int i = Math.max(0, events.size() - n); i < events.size(); i++) {
            SwitchEvent e = events.get(i);
            out.add((e.getFromHeads() == null ? "" : e.getFromHeads() + " -> ") + e.getToHeads() + " heads: " + e.getReason());
        }
        return out;
    }

    /** The latency budget now, or NaN without one (a refused table runs its fallback without a loop). */
    double budgetMs(Signals.Reading r) {
        LatencyLoop loop = switcher.getLoop();
        return loop == null ? Double.NaN : loop.getBudgetNow();
    }

    /** The table the switcher reads fell back to its fewest heads: why (one line), or null. */
    String fallback() {
        return switcher.getFallback();
    }

    /** Stop taking corrections, and wait (at most {@link #SAVE_WAIT_S} s) for the last one to reach the disk. */
    void close() {
        saver.shutdown();
        try {
            saver.awaitTermination(SAVE_WAIT_S, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();  // stopping anyway: the write goes on in the background
        }
    }

    private void trim() {
        List<SwitchEvent> events = switcher.getEvents();
        if (events.size() > KEEP_EVENTS) events.subList(0, events.size() - KEEP_EVENTS).clear();
    }
}
