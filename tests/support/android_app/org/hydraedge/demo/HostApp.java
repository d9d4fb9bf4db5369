package org.hydraedge.demo;

import java.io.File;

import org.hydraedge.host.NativeRuntime;

/**
 * What the host drivers open as the app does, from their first three arguments (LIBRARIES BUNDLE REBUILT): the
 * APK's runtime loaded, the bundle checked (BundleStore, rebuilding into REBUILT), the switcher (HeadSwitch) and
 * the engines, whose programs are probed in child processes as the app's probe service would.
 */
final class HostApp implements AutoCloseable {
    final BundleStore bundle;
    final HeadSwitch sw;
    final Engines engines;

    private HostApp(BundleStore bundle, HeadSwitch sw, Engines engines) {
        this.bundle = bundle;
        this.sw = sw;
        this.engines = engines;
    }

    static HostApp open(String[] args) throws Exception {
        NativeRuntime.load(args[0]);
        BundleStore bundle = BundleStore.check(new File(args[1]));
        bundle.cacheDir = new File(args[2]);
        HeadSwitch sw = HeadSwitch.open(bundle, false);
        return new HostApp(bundle, sw, new Engines(bundle, new ProcessProber()));
    }

    /** The last load failure and the latest [switches] switches, as the app's screen shows them. */
    void report(int switches) {
        if (engines.lastFailure != null) System.out.println("failed " + engines.lastFailure);
        for (String line : sw.recent(switches)) System.out.println("switch " + line);
    }

    @Override
    public void close() {
        engines.close();
        sw.close();
    }
}
