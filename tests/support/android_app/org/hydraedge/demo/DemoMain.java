package org.hydraedge.demo;

import java.io.File;

import org.hydraedge.host.NativeRuntime;

/**
 * The demo on a desktop JVM, in the APK's own runtime: MainActivity.runDemo's steps (DemoLoop, HeadSwitch,
 * Engines, BundleStore) without its views or its pause between images, a cool and charging phone's scripted
 * readings. usage: DemoMain LIBRARIES BUNDLE REBUILT SECONDS; prints "frame N heads" each time the head count
 * changes, then the failures and the switches as the screen shows them.
 */
public final class DemoMain {
    private DemoMain() {
    }

    public static void main(String[] args) throws Exception {
        NativeRuntime.load(args[0]);
        BundleStore bundle = BundleStore.check(new File(args[1]));
        bundle.cacheDir = new File(args[2]);
        HeadSwitch sw = HeadSwitch.open(bundle, false);
        Engines engines = new Engines(bundle, new ProcessProber());
        DemoLoop demo = new DemoLoop(bundle, sw, engines);
        Readings phone = new BenchMain.Cool();
        long end = System.nanoTime() + (long) (Double.parseDouble(args[3]) * 1e9);
        int shown = 0;
        int steps = 0;
        try {
            while (System.nanoTime() < end) {
                DemoLoop.Frame f = demo.step(phone.read());
                steps++;
                if (f.heads != shown) {
                    System.out.println("frame " + f.heads + " heads: image " + (f.image + 1) + "/" + f.images + " class "
                            + f.predicted + " (fp32 says " + f.expected + "), p90 " + f.latency.getDouble("p90_ms")
                            + " ms, budget " + f.budgetMs + " ms");
                    shown = f.heads;
                }
                Thread.sleep(2);
            }
            System.out.println("steps " + steps);
            if (engines.lastFailure != null) System.out.println("failed " + engines.lastFailure);
            for (String line : sw.recent(10)) System.out.println("switch " + line);
        } catch (BundleStore.Refused e) {
            System.out.println("refused " + e.getMessage());
        } finally {
            engines.close();
            sw.close();
        }
    }
}
