package org.hydraedge.demo;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/** sha256 of files, as hex: the manifest names every bundle file by it. */
final class Hashes {
    private Hashes() {}

    static String sha256(File file) throws IOException {
        InputStream in = new FileInputStream(file);
        try {
            MessageDigest md = MessageDigest.getInstance("SHA-256");
            byte[] buf = new byte[1 << 16];
            int n;
            while ((n = in.read(buf)) > 0) {
                md.update(buf, 0, n);
            }
            StringBuilder hex = new StringBuilder(64);
            for (byte x : md.digest()) {
                hex.append(String.format("%02x", x & 0xff));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IOException("no SHA-256 on this phone", e);
        } finally {
            in.close();
        }
    }
}
