package org.hydraedge.demo;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The desktop JVM's Prober: {@link ProbeMain} in a child process (the launcher and classpath the test gives in
 * HYDRA_EDGE_PROBE, tab-separated), where ServiceProber on a phone uses ProbeService's own process. A child that
 * the runtime ends is a refused program; its last E/ line (the runtime's error, which logcat keeps on a phone)
 * says why.
 */
final class ProcessProber implements Prober {
    private final List<String> command = Arrays.asList(System.getenv("HYDRA_EDGE_PROBE").split("\t"));

    @Override
    public String probe(File pte, File inputs, int threads) throws InterruptedException {
        List<String> argv = new ArrayList<String>(command);
        argv.addAll(Arrays.asList(pte.getPath(), inputs.getPath(), String.valueOf(threads)));
        try {
            File log = File.createTempFile("probe", ".log");
            try {
                Process child = new ProcessBuilder(argv).redirectError(log).start();
                BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
                String said = null;
                for (String line; (line = out.readLine()) != null; ) {
                    if (line.startsWith("probe ")) said = line.substring("probe ".length());
                }
                int code = child.waitFor();
                if (code == 0 && Probe.OK.equals(said)) return null;
                if (code == 0 && said != null) return said;
                String error = null;
                for (String line : Files.readAllLines(log.toPath(), StandardCharsets.UTF_8)) {
                    if (line.startsWith("E/")) error = line;
                }
                return "the ExecuTorch runtime ended its process loading " + pte.getName() + " (exit " + code
                        + (error == null ? "" : ": " + error) + ")";
            } finally {
                log.delete();
            }
        } catch (IOException e) {
            return "cannot start the probe's process: " + e.getMessage();
        }
    }

    @Override
    public void close() {
    }
}
