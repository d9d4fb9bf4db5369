package org.hydraedge.demo;

import android.content.Context;
import android.content.res.AssetManager;

import org.hydraedge.core.BundleException;
import org.hydraedge.core.Manifest;
import org.hydraedge.core.Rebuild;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.List;

/**
 * The bundle the APK carries (assets/bundle/ with manifest.json, assets/lut.json), copied to the app's
 * files folder (ExecuTorch loads a path) and checked there: every file the manifest names must have the
 * manifest's sha256, and the table must name this manifest's sha256 and this bundle's artefacts.
 * Anything else is refused with one line that says which file and what to do.
 */
final class BundleStore {
    static final String ASSET_BUNDLE = "bundle";
    static final String ASSET_LUT = "lut.json";

    /** A bundle or table that must not be run; the message is shown on screen as it is. */
    static final class Refused extends Exception {
        Refused(String message) {
            super(message);
        }
    }

    /** One artefact of the manifest, as the app needs it. */
    static final class Artefact {
        final String id;
        final int heads;
        final String file;
        final String sha256;
        final int threads;
        final boolean compact;
        final String golden;
        final String goldenInputs;
        final double maxAbsDiff;
        final double minTop1Agreement;

        Artefact(JSONObject a) throws JSONException {
            id = a.getString("id");
            heads = a.getInt("heads");
            file = a.getString("file");
            sha256 = a.getString("sha256");
            threads = a.optInt("threads", 4);
            compact = a.has("compact") && !a.isNull("compact");
            JSONObject g = a.getJSONObject("golden");
            golden = g.getString("file");
            goldenInputs = g.isNull("inputs_file") || !g.has("inputs_file") ? null : g.getString("inputs_file");
            JSONObject tol = g.getJSONObject("tolerance");
            maxAbsDiff = tol.getDouble("max_abs_diff");
            minTop1Agreement = tol.getDouble("min_top1_agreement");
        }
    }

    final File dir;
    /** Where rebuilt artefacts of a compact bundle are written (the app's cache dir). */
    File cacheDir;
    private Manifest coreManifest;
    final JSONObject manifest;
    final JSONObject lut;
    final String manifestSha256;
    final String lutSha256;
    final List<Artefact> artefacts = new ArrayList<Artefact>();

    private BundleStore(File dir, JSONObject manifest, JSONObject lut, String manifestSha256, String lutSha256) {
        this.dir = dir;
        this.manifest = manifest;
        this.lut = lut;
        this.manifestSha256 = manifestSha256;
        this.lutSha256 = lutSha256;
    }

    Artefact byHeads(int heads) {
        for (Artefact a : artefacts) {
            if (a.heads == heads) return a;
        }
        return null;
    }

    File file(String name) {
        return new File(dir, name);
    }

    /** The .npz holding {@code a}'s golden inputs (under "inputs"): its shared inputs file, or its own golden file. */
    File goldenInputs(Artefact a) {
        return file(a.goldenInputs != null ? a.goldenInputs : a.golden);
    }

    /** Copy the assets out of the APK (each through a .part file) and check them all. */
    static BundleStore open(Context context) throws Refused {
        File dir = new File(context.getFilesDir(), ASSET_BUNDLE);
        AssetManager assets = context.getAssets();
        try {
            String[] names = assets.list(ASSET_BUNDLE);
            if (names == null || names.length == 0) {
                throw new Refused("this APK holds no bundle (assets/bundle is empty); build it with hydra-edge android-app --bundle");
            }
            dir.mkdirs();
            for (String name : names) {
                copy(assets, ASSET_BUNDLE + "/" + name, new File(dir, name));
            }
            copy(assets, ASSET_LUT, new File(dir, ASSET_LUT));
        } catch (IOException e) {
            throw new Refused("cannot copy the bundle out of the APK: " + e.getMessage() + "; free some storage and start again");
        }
        BundleStore b = check(dir);
        b.cacheDir = new File(context.getCacheDir(), "rebuilt");
        return b;
    }

    /**
     * The .pte file ExecuTorch loads for {@code a} (it loads from a path, not from bytes): the bundle's own
     * file, or for a compact record the bytes org.hydraedge.core.Rebuild rebuilds from the recipe over the
     * largest artefact (returned only when their sha256 is the manifest's), written once to the cache dir
     * through a temporary file. A file found there is used only when its sha256 is the manifest's.
     */
    File artefactFile(Artefact a) throws BundleException, IOException {
        if (!a.compact) return file(a.file);
        File out = new File(cacheDir, a.sha256 + ".pte");
        if (out.isFile() && Hashes.sha256(out).equals(a.sha256)) return out;
        if (coreManifest == null) coreManifest = Manifest.Companion.read(dir);
        byte[] data = Rebuild.INSTANCE.artefactBytes(dir, coreManifest, a.heads);
        cacheDir.mkdirs();
        File tmp = new File(cacheDir, a.sha256 + ".pte.part");
        OutputStream o = new FileOutputStream(tmp);
        try {
            o.write(data);
            ((FileOutputStream) o).getFD().sync();
        } finally {
            o.close();
        }
        if (!tmp.renameTo(out)) {
            tmp.delete();
            throw new IOException("cannot write " + out + " (free some storage)");
        }
        if (!Hashes.sha256(out).equals(a.sha256)) {  // what ExecuTorch maps is what was checked
            out.delete();
            throw new IOException(out + ": sha256 differs from manifest.json's after writing it (storage full or failing?)");
        }
        return out;
    }

    /** Check a bundle folder: manifest, every file's sha256, the table's binding. */
    static BundleStore check(File dir) throws Refused {
        File manifestFile = new File(dir, "manifest.json");
        File lutFile = new File(dir, ASSET_LUT);
        try {
            String manifestSha = Hashes.sha256(manifestFile);
            String lutSha = Hashes.sha256(lutFile);
            BundleStore b = new BundleStore(dir, new JSONObject(Text.read(manifestFile)),
                    new JSONObject(Text.read(lutFile)), manifestSha, lutSha);
            b.checkFiles();
            b.checkTable();
            return b;
        } catch (IOException e) {
            throw new Refused("cannot read the bundle: " + e.getMessage() + "; rebuild the APK with hydra-edge android-app");
        } catch (JSONException e) {
            throw new Refused("manifest.json or lut.json is not the JSON hydra-edge writes (" + e.getMessage()
                    + "); rebuild the APK with hydra-edge android-app");
        }
    }

    private void checkFiles() throws JSONException, IOException, Refused {
        String target = manifest.getJSONObject("target").optString("name", "?");
        JSONArray list = manifest.getJSONArray("artefacts");
        for (int i = 0; i < list.length(); i++) {
            JSONObject a = list.getJSONObject(i);
            if (!"executorch".equals(a.getString("format"))) {
                throw new Refused("artefact " + a.getString("id") + " is " + a.getString("format")
                        + " (target " + target + "); this app runs ExecuTorch .pte: convert with --target android");
            }
            Artefact artefact = new Artefact(a);
            artefacts.add(artefact);
            if (artefact.compact) {
                JSONObject c = a.getJSONObject("compact");
                verify(c.getString("recipe"), c.getString("sha256"), artefact.id + " compact.recipe");
                JSONObject recipe = new JSONObject(Text.read(file(c.getString("recipe"))));
                for (String piece : new String[] {"skeleton", "source"}) {
                    JSONObject p = recipe.getJSONObject(piece);
                    verify(p.getString("file"), p.getString("sha256"), artefact.id + " recipe " + piece);
                }
            } else {
                verify(artefact.file, artefact.sha256, artefact.id + " file");
            }
            JSONObject g = a.getJSONObject("golden");
            verify(g.getString("file"), g.getString("sha256"), artefact.id + " golden.file");
            if (artefact.goldenInputs != null) {
                verify(artefact.goldenInputs, g.getString("inputs_sha256"), artefact.id + " golden.inputs_file");
            }
        }
        if (artefacts.isEmpty()) {
            throw new Refused("manifest.json names no artefact; convert the model with --target android");
        }
    }

    private void verify(String name, String sha256, String what) throws IOException, Refused {
        File f = file(name);
        if (!f.isFile()) {
            throw new Refused(name + " is missing (" + what + " in manifest.json); rebuild the APK from an intact bundle");
        }
        if (!Hashes.sha256(f).equals(sha256)) {
            throw new Refused(name + ": sha256 differs from manifest.json's (" + what
                    + "); the bundle was changed: rebuild the APK from an intact bundle");
        }
    }

    private void checkTable() throws JSONException, Refused {
        String bound = lut.getJSONObject("bundle").getString("manifest_sha256");
        if (!bound.equals(manifestSha256)) {
            throw new Refused("lut.json was built for another bundle (manifest sha256 " + bound.substring(0, 12)
                    + ", this bundle's is " + manifestSha256.substring(0, 12) + "); run hydra-edge lut for this bundle");
        }
        JSONArray candidates = lut.getJSONArray("candidates");
        for (int i = 0; i < candidates.length(); i++) {
            JSONObject c = candidates.getJSONObject(i);
            Artefact a = byHeads(c.getInt("heads"));
            if (a == null || !a.sha256.equals(c.getString("sha256"))) {
                throw new Refused("lut.json names " + c.getString("file") + " with a sha256 this bundle does not have;"
                        + " run hydra-edge lut for this bundle");
            }
        }
    }

    private static void copy(AssetManager assets, String asset, File to) throws IOException {
        File tmp = new File(to.getPath() + ".part");
        InputStream in = assets.open(asset, AssetManager.ACCESS_STREAMING);
        try {
            OutputStream out = new FileOutputStream(tmp);
            try {
                byte[] buf = new byte[1 << 16];
                int n;
                while ((n = in.read(buf)) > 0) {
                    out.write(buf, 0, n);
                }
            } finally {
                out.close();
            }
        } finally {
            in.close();
        }
        if (!tmp.renameTo(to)) {
            throw new IOException("cannot write " + to);
        }
    }
}
