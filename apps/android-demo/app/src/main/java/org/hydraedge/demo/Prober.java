package org.hydraedge.demo;

import java.io.File;

/**
 * Where a program is first loaded and run (see {@link Probe}): a process whose end the app survives. On a phone
 * {@link ServiceProber} (ProbeService, android:process=":probe"); on a desktop JVM, a child process.
 */
interface Prober {
    /** Null when {@code pte} loads and answers the first image of {@code inputs} (.npz); else why not, one line. */
    String probe(File pte, File inputs, int threads) throws InterruptedException;

    /** Let the probe's process go. */
    void close();
}
