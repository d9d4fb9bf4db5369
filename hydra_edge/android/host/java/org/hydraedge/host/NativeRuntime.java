package org.hydraedge.host;

import com.facebook.soloader.nativeloader.NativeLoader;
import com.facebook.soloader.nativeloader.SystemDelegate;

/**
 * The APK's native libraries, loaded in the order a phone's linker loads them (the NDK's C++ runtime,
 * fbjni, ExecuTorch), from the folder of their host-patched copies; fbjni's NativeLoader is told to use
 * System.loadLibrary, as SoLoader does on a phone for libraries extracted from the APK.
 */
public final class NativeRuntime {
    private static final String[] LIBRARIES = {"libc++_shared.so", "libfbjni.so", "libexecutorch.so"};

    private NativeRuntime() {
    }

    public static synchronized void load(String folder) {
        if (NativeLoader.isInitialized()) return;
        NativeLoader.init(new SystemDelegate());
        for (String library : LIBRARIES) {
            System.load(folder + "/" + library);
        }
    }
}
