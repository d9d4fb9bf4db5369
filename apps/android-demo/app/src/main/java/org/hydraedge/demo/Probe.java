package org.hydraedge.demo;

import java.io.File;
import java.io.IOException;

/**
 * A program loaded and run on one golden input, in the process that calls it: on a phone, ProbeService's own
 * process (android:process=":probe"), never the app's.
 *
 * Why a process of its own: ExecuTorch 0.8.5's JNI library carries its own copy of the C++ runtime, so an
 * error it raises while loading or running (a file cut short, a delegate it lacks, an input of another model's
 * shape) never reaches fbjni as a C++ exception: fbjni asserts and the process aborts. A garbled program can
 * crash it outright. No check before loading can know everything the runtime refuses; a process the app can
 * lose can. The app loads a program itself only once a probe has loaded and run it.
 */
final class Probe {
    static final String OK = "ok";

    private Probe() {
    }

    /** {@link #OK}, or why the program cannot run, in one line (what the runtime raised as a Java exception). */
    static String run(File pte, File inputs, int threads) {
        try {
            Npy images = Npy.readNpz(inputs).get("inputs");
            if (images == null || images.rows() == 0) return inputs.getName() + " holds no golden inputs";
            long[] shape = images.shape.clone();
            shape[0] = 1;
            Engine engine = Engine.load(0, pte, threads);
            try {
                return engine.run(images.row(0), shape).length > 0 ? OK : pte.getName() + " answers no outputs";
            } finally {
                engine.close();
            }
        } catch (IOException | RuntimeException e) {
            return Text.oneLine(e);
        }
    }
}
