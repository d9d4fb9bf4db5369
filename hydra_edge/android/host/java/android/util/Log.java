package android.util;

/**
 * android.util.Log on a desktop JVM: ExecuTorch's Java classes and the app log through it, and on the host
 * their lines belong in the run's log file (stderr, which hydra_edge.android.host_runtime keeps), as logcat
 * keeps them on a phone.
 */
public final class Log {
    private Log() {
    }

    private static int line(char level, String tag, String message) {
        System.err.println(level + "/" + tag + ": " + message);
        return 0;
    }

    public static int v(String tag, String message) {
        return line('V', tag, message);
    }

    public static int d(String tag, String message) {
        return line('D', tag, message);
    }

    public static int i(String tag, String message) {
        return line('I', tag, message);
    }

    public static int w(String tag, String message) {
        return line('W', tag, message);
    }

    public static int e(String tag, String message) {
        return line('E', tag, message);
    }

    public static int e(String tag, String message, Throwable t) {
        return line('E', tag, message + ": " + t);
    }
}
