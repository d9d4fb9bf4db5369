package org.hydraedge.demo;

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
        HostApp app = HostApp.open(args);
        DemoLoop demo = new DemoLoop(app.bundle, app.sw, app.engines);
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
            app.report(10);
        } catch (BundleStore.Refused e) {
            System.out.println("refused " + e.getMessage());
        } finally {
            app.close();
        }
    }
}
