package org.hydraedge.host;

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Paths;

import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Module;
import org.pytorch.executorch.Tensor;

/**
 * Runs .pte programs in the APK's ExecuTorch runtime through its own Java API, as the app calls it
 * (Module.load with memory mapping, one single-image forward per input row), for
 * hydra_edge.android.host_runtime, which compares the outputs with the golden pairs.
 *
 * usage: RunPrograms LIBRARY_FOLDER JOBS
 * JOBS: one program a line, tab-separated: id, .pte path, inputs (raw float32, little-endian), outputs
 * (written the same way), rows, the shape of one row's tensor as comma-separated sizes (1,C,H,W).
 * stdout, one line per step, so the caller knows which program a native abort ended in:
 *   load ID | ran ID SECONDS | error ID CLASS: MESSAGE
 */
public final class RunPrograms {
    private RunPrograms() {
    }

    public static void main(String[] args) throws IOException {
        NativeRuntime.load(args[0]);
        BufferedReader jobs = new BufferedReader(new InputStreamReader(new FileInputStream(args[1]), "UTF-8"));
        try {
            String line;
            while ((line = jobs.readLine()) != null) {
                if (!line.isEmpty()) run(line.split("\t"));
            }
        } finally {
            jobs.close();
        }
    }

    private static void run(String[] job) throws IOException {
        String id = job[0];
        int rows = Integer.parseInt(job[4]);
        String[] sizes = job[5].split(",");
        long[] shape = new long[sizes.length];
        for (int i = 0; i < sizes.length; i++) shape[i] = Long.parseLong(sizes[i]);
        float[] inputs = readFloats(job[2]);
        int per = inputs.length / rows;
        say("load " + id);
        long start = System.nanoTime();
        try {
            Module module = Module.load(job[1], Module.LOAD_MODE_MMAP, 1);
            OutputStream out = new FileOutputStream(job[3]);
            try {
                for (int r = 0; r < rows; r++) {
                    float[] row = new float[per];
                    System.arraycopy(inputs, r * per, row, 0, per);
                    EValue[] result = module.forward(EValue.from(Tensor.fromBlob(row, shape)));
                    out.write(littleEndian(result[0].toTensor().getDataAsFloatArray()));
                }
            } finally {
                out.close();
                module.destroy();
            }
        } catch (RuntimeException e) {  // what the runtime raises as a Java exception: this program fails, not the rest
            say("error " + id + " " + e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage()).split("\n", 2)[0]);
            return;
        }
        say("ran " + id + " " + (System.nanoTime() - start) / 1e9);
    }

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static float[] readFloats(String path) throws IOException {
        ByteBuffer bytes = ByteBuffer.wrap(Files.readAllBytes(Paths.get(path))).order(ByteOrder.LITTLE_ENDIAN);
        float[] values = new float[bytes.remaining() / 4];
        bytes.asFloatBuffer().get(values);
        return values;
    }

    private static byte[] littleEndian(float[] values) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        bytes.asFloatBuffer().put(values);
        return bytes.array();
    }
}
