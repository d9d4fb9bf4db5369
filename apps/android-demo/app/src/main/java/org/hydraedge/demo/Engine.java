package org.hydraedge.demo;

import java.io.File;

import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Module;
import org.pytorch.executorch.Tensor;

/** One .pte in ExecuTorch (XNNPACK delegate): load once, then single-image forwards. */
final class Engine {
    final int heads;
    private final Module module;

    private Engine(int heads, Module module) {
        this.heads = heads;
        this.module = module;
    }

    static Engine load(BundleStore.Artefact artefact, File file, int threads) {
        return load(artefact.heads, file, threads);
    }

    static Engine load(int heads, File file, int threads) {
        return new Engine(heads, Module.load(file.getAbsolutePath(), Module.LOAD_MODE_MMAP, threads));
    }

    /** Logits for one image (C*H*W floats, already normalised) of shape {@code inputShape} (1, C, H, W). */
    float[] run(float[] image, long[] inputShape) {
        EValue[] out = module.forward(EValue.from(Tensor.fromBlob(image, inputShape)));
        return out[0].toTensor().getDataAsFloatArray();
    }

    void close() {
        module.destroy();
    }

    static int argmax(float[] v) {
        int best = 0;
        for (int i = 1; i < v.length; i++) {
            if (v[i] > v[best]) best = i;
        }
        return best;
    }
}
