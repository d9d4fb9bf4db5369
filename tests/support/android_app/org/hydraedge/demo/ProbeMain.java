package org.hydraedge.demo;

import java.io.File;

import org.hydraedge.host.NativeRuntime;

/** The probe's process on a desktop JVM: ProbeService's work. usage: ProbeMain LIBRARIES PTE INPUTS THREADS */
public final class ProbeMain {
    private ProbeMain() {
    }

    public static void main(String[] args) {
        NativeRuntime.load(args[0]);
        System.out.println("probe " + Probe.run(new File(args[1]), new File(args[2]), Integer.parseInt(args[3])));
    }
}
