package org.hydraedge.demo;

/**
 * The demo's start on a desktop JVM, in the APK's own runtime: the bundle checked (BundleStore), the switcher
 * opened (HeadSwitch), a cool, charging phone's reading, and the engine the app would run (Engines.choose, its
 * programs probed in child processes), which then classifies the first golden image.
 * usage: LoadFailover LIBRARIES BUNDLE REBUILT; prints "ran N heads: class C (fp32 says R)", "failed ...",
 * then "switch ..." lines as the app shows them.
 */
public final class LoadFailover {
    private LoadFailover() {
    }

    public static void main(String[] args) throws Exception {
        HostApp app = HostApp.open(args);
        try {
            Engine engine = app.engines.choose(app.sw, new BenchMain.Cool().read());
            BundleStore.Artefact a = app.bundle.byHeads(engine.heads);
            Npy inputs = Npy.readNpz(app.bundle.goldenInputs(a)).get("inputs");
            long[] shape = inputs.shape.clone();
            shape[0] = 1;
            float[] logits = engine.run(inputs.row(0), shape);
            int expected = Engine.argmax(Npy.readNpz(app.bundle.file(a.golden)).get("reference").row(0));
            System.out.println("ran " + engine.heads + " heads: class " + Engine.argmax(logits) + " (fp32 says " + expected + ")");
            app.report(5);
        } catch (BundleStore.Refused e) {
            System.out.println("refused " + e.getMessage());
        } finally {
            app.close();
        }
    }
}
