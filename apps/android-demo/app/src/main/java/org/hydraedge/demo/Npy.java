package org.hydraedge.demo;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;

/** The arrays of a golden pair (numpy's .npz: a zip of .npy files), as float32, C order. */
final class Npy {
    final long[] shape;
    final float[] data;

    private Npy(long[] shape, float[] data) {
        this.shape = shape;
        this.data = data;
    }

    int rows() {
        return (int) shape[0];
    }

    /** Row {@code i} (one image, or one image's logits). */
    float[] row(int i) {
        int n = data.length / rows();
        float[] out = new float[n];
        System.arraycopy(data, i * n, out, 0, n);
        return out;
    }

    static Map<String, Npy> readNpz(File file) throws IOException {
        Map<String, Npy> arrays = new HashMap<String, Npy>();
        ZipInputStream zip = new ZipInputStream(new FileInputStream(file));
        try {
            ZipEntry entry;
            while ((entry = zip.getNextEntry()) != null) {
                String name = entry.getName();
                if (name.endsWith(".npy")) {
                    arrays.put(name.substring(0, name.length() - 4), parse(readAll(zip), file + ":" + name));
                }
            }
        } finally {
            zip.close();
        }
        return arrays;
    }

    private static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buf = new byte[1 << 16];
        int n;
        while ((n = in.read(buf)) > 0) {
            out.write(buf, 0, n);
        }
        return out.toByteArray();
    }

    private static final Pattern DESCR = Pattern.compile("'descr':\\s*'([<>|=]?)([a-z])(\\d+)'");
    private static final Pattern SHAPE = Pattern.compile("'shape':\\s*\\(([^)]*)\\)");

    static Npy parse(byte[] b, String where) throws IOException {
        if (b.length < 10 || (b[0] & 0xff) != 0x93 || b[1] != 'N' || b[2] != 'U') {
            throw new IOException(where + " is not a .npy array");
        }
        ByteBuffer bb = ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
        int major = b[6];
        int headerLen = major == 1 ? (bb.getShort(8) & 0xffff) : bb.getInt(8);
        int start = major == 1 ? 10 + headerLen : 12 + headerLen;
        String header = new String(b, major == 1 ? 10 : 12, headerLen, "latin1");
        if (header.contains("'fortran_order': True")) {
            throw new IOException(where + ": Fortran order is not read");
        }
        Matcher d = DESCR.matcher(header);
        Matcher s = SHAPE.matcher(header);
        if (!d.find() || !s.find()) {
            throw new IOException(where + ": unreadable .npy header " + header.trim());
        }
        String[] dims = s.group(1).split(",");
        int rank = 0;
        for (String dim : dims) {
            if (dim.trim().length() > 0) rank++;
        }
        long[] shape = new long[rank];
        long count = 1;
        int k = 0;
        for (String dim : dims) {
            if (dim.trim().length() > 0) {
                shape[k] = Long.parseLong(dim.trim());
                count *= shape[k++];
            }
        }
        ByteBuffer data = ByteBuffer.wrap(b, start, b.length - start)
                .order(">".equals(d.group(1)) ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN);
        String kind = d.group(2) + d.group(3);
        float[] out = new float[(int) count];
        for (int i = 0; i < out.length; i++) {
            if ("f4".equals(kind)) out[i] = data.getFloat();
            else if ("f8".equals(kind)) out[i] = (float) data.getDouble();
            else if ("i8".equals(kind)) out[i] = data.getLong();
            else if ("i4".equals(kind)) out[i] = data.getInt();
            else throw new IOException(where + ": dtype " + kind + " is not read");
        }
        return new Npy(shape, out);
    }
}
