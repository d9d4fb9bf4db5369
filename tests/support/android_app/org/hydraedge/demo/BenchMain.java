package org.hydraedge.demo;

import java.io.File;

import org.hydraedge.host.NativeRuntime;
import org.json.JSONObject;

/**
 * The app's bench mode on a desktop JVM, in the APK's own runtime: MainActivity.runBench without its views, the
 * same Bench, Engines (programs probed in child processes) and BundleStore, a cool and charging phone's scripted
 * readings in place of PowerManager and the battery broadcast, this host's identity in place of android.os.Build.
 * usage: BenchMain LIBRARIES BUNDLE REBUILT OUT RUNS WARMUP THREADS PLAN [ONLY...] (PLAN: the rounds' JSON, or -)
 */
public final class BenchMain {
    private BenchMain() {
    }

    /** A cool, charging phone: thermal status NONE, no forecast asked for (as before API 30), 100 % and charging
     * (BatteryManager.BATTERY_STATUS_CHARGING = 2): what the scripted sensors say. */
    static final class Cool implements Readings {
        @Override
        public Signals.Reading read() {
            return new Signals.Reading(System.currentTimeMillis(), 0, Float.NaN, 0, 100, true, "Charging", 2, 30f,
                    null, null, false);
        }
    }

    public static void main(String[] args) throws Exception {
        NativeRuntime.load(args[0]);
        File out = new File(args[3]);
        Bench bench = new Bench(out, new Cool());
        Engines engines = null;
        try {
            BundleStore bundle;
            try {
                bundle = BundleStore.check(new File(args[1]));
            } catch (BundleStore.Refused e) {  // as the app does for a bundle it refuses
                bench.fatal(e.getMessage());
                throw e;
            }
            bundle.cacheDir = new File(args[2]);
            engines = new Engines(bundle, new ProcessProber());
            JSONObject host = new JSONObject();
            host.put("model", "desktop JVM " + System.getProperty("java.version"));
            host.put("cpu_model", JSONObject.NULL);
            host.put("arch", "x86_64");
            host.put("cores", Runtime.getRuntime().availableProcessors());
            host.put("os", System.getProperty("os.name") + " " + System.getProperty("os.version"));
            host.put("kernel", System.getProperty("os.version"));
            host.put("python", JSONObject.NULL);
            String[] only = args.length > 8 ? java.util.Arrays.copyOfRange(args, 8, args.length) : null;
            String plan = "-".equals(args[7]) ? null : args[7];
            System.out.print(bench.run(bundle, engines, host, only, Integer.parseInt(args[4]), Integer.parseInt(args[5]),
                    Integer.parseInt(args[6]), plan, new Bench.Progress() {
                        @Override
                        public void timing(String artefact, String summary) {
                            System.out.println("timing " + artefact);
                        }
                    }));
        } catch (BundleStore.Refused e) {
            System.out.println("refused " + e.getMessage());
        } finally {
            if (engines != null) engines.close();
            bench.close();
        }
    }
}
