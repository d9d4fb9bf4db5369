package org.hydraedge.demo;

import java.io.File;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * The programs the app runs, one Engine per head count, loaded when first chosen. Before the app loads a
 * program it has not run yet, the {@link Prober} loads and runs it in a process of its own (once per sha256):
 * a program the runtime refuses, aborts on or crashes on costs that process, and here it is a failed load,
 * which the switcher library answers as a board's switcher does (the fewest heads, that head count never again).
 */
final class Engines {
    /** A head count whose program cannot run here: why, in one line. */
    static final class LoadFailed extends Exception {
        LoadFailed(String message) {
            super(message);
        }
    }

    private final BundleStore bundle;
    private final Prober prober;
    private final Map<Integer, Engine> loaded = new HashMap<Integer, Engine>();
    private final Set<String> probed = new HashSet<String>();
    /** The last head count that could not run, and why ("6 heads cannot run: ..."), or null. */
    String lastFailure;
    /** How long the last probe took (ns; 0 when the program had been probed before): bench mode leaves it out of load_s. */
    long lastProbeNs;

    Engines(BundleStore bundle, Prober prober) {
        this.bundle = bundle;
        this.prober = prober;
    }

    /** The threads a program runs with: the asked number (0: the manifest's), at most the cores. */
    static int threadsFor(BundleStore.Artefact a, int asked) {
        int cores = Runtime.getRuntime().availableProcessors();
        return Math.min(asked > 0 ? asked : a.threads, cores);
    }

    /** {@code a}'s program as the app may load it: rebuilt when compact, and probed once in the prober's process. */
    File checked(BundleStore.Artefact a, int threads) throws Exception {
        File file = bundle.artefactFile(a);
        lastProbeNs = 0;
        if (!probed.contains(a.sha256)) {
            long start = System.nanoTime();
            String why = prober.probe(file, bundle.goldenInputs(a), threads);
            lastProbeNs = System.nanoTime() - start;
            if (why != null) throw new LoadFailed(why);
            probed.add(a.sha256);
        }
        return file;
    }

    /**
     * The engine for the head count the switcher picks for reading {@code r}: a head count that cannot be
     * rebuilt, probed or loaded goes to {@link HeadSwitch#loadFailed} and the switcher picks again, so the
     * fewest heads run; when they cannot either, Refused with that line.
     */
    Engine choose(HeadSwitch sw, Signals.Reading r) throws BundleStore.Refused, InterruptedException {
        while (true) {
            int heads = sw.poll(r);
            Engine engine = loaded.get(heads);
            if (engine != null) return engine;
            BundleStore.Artefact a = bundle.byHeads(heads);
            try {
                int threads = threadsFor(a, 0);
                engine = Engine.load(a, checked(a, threads), threads);
                loaded.put(heads, engine);
                return engine;
            } catch (InterruptedException e) {
                throw e;
            } catch (Exception e) {  // a failed rebuild, probe or load: fewer heads, as on a board
                String why = Text.oneLine(e);
                lastFailure = heads + " heads cannot run: " + why;
                if (!sw.loadFailed(heads, why)) throw new BundleStore.Refused(lastFailure);
            }
        }
    }

    void close() {
        for (Engine e : loaded.values()) e.close();
        loaded.clear();
        prober.close();
    }
}
