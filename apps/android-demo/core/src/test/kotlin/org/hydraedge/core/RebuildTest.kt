package org.hydraedge.core

import org.json.JSONArray
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.io.File
import java.nio.file.Files
import kotlin.random.Random

/**
 * The rebuild on a small hand-made compact bundle: a "source artefact" holding two tensors, and a
 * 3-head artefact that holds a prefix block of one and three row blocks (qkv-like) of the other
 * between header and trailer bytes. The expected artefact is assembled here item by item, apart
 * from the library's block copies. The parity test proves the rebuild equal to Python's on real
 * converted bundles; these pin the path checks and the limits.
 */
class RebuildTest {
    private val random = Random(7)
    private fun bytes(n: Int) = ByteArray(n).also { random.nextBytes(it) }

    /** A compact bundle in [dir]; returns the artefact the recipe must rebuild. */
    private class Bundle(val dir: File, val artefact: ByteArray, val recipe: JSONObject, val manifest: JSONObject) {
        val recipeFile = File(dir, "h3.recipe.json")
        fun write(recipe: JSONObject = this.recipe, manifest: JSONObject = this.manifest) {
            recipeFile.writeText(recipe.toString(1))
            val m = JSONObject(manifest.toString())
            val compact = m.getJSONArray("artefacts").getJSONObject(0).optJSONObject("compact")
            if (compact != null && !compact.has("keep_sha256")) compact.put("sha256", Rebuild.sha256Hex(recipeFile.readBytes()))
            compact?.remove("keep_sha256")
            File(dir, "manifest.json").writeText(m.toString(1))
        }
        fun read(): Manifest = Manifest.read(dir)
    }

    private fun bundle(dir: File): Bundle {
        // source: 16 header bytes, tensor A (<f4, [4, 6]), tensor B (<f2, [12, 5]), 8 trailer bytes
        val aOffset = 16; val bOffset = aOffset + 4 * 6 * 4
        val source = bytes(bOffset + 12 * 5 * 2 + 8)
        File(dir, "h12.tflite").writeBytes(source)
        // rebuilt: header, A[0:2, 0:3], middle, B[[0:2, 4:6, 8:10], 0:5], trailer
        fun item(offset: Int, size: Int) = source.copyOfRange(offset, offset + size)
        val header = bytes(40); val middle = bytes(9); val trailer = bytes(13)
        val a = (0 until 2).flatMap { i -> (0 until 3).map { j -> item(aOffset + (i * 6 + j) * 4, 4) } }
        val b = listOf(0, 1, 4, 5, 8, 9).flatMap { i -> (0 until 5).map { j -> item(bOffset + (i * 5 + j) * 2, 2) } }
        val artefact = (listOf(header) + a + listOf(middle) + b + listOf(trailer)).reduce { x, y -> x + y }
        File(dir, "h3.skeleton").writeBytes(header + middle + trailer)
        fun piece(file: String, data: ByteArray) = JSONObject().put("file", file).put("sha256", Rebuild.sha256Hex(data)).put("bytes", data.size)
        fun spans(vararg s: Int) = JSONArray(s.toList().chunked(2).map { JSONArray(it) })
        val ranges = JSONArray()
            .put(JSONObject().put("offset", 40).put("source_offset", aOffset).put("dtype", "<f4").put("shape", JSONArray(listOf(4, 6)))
                .put("index", JSONArray().put(spans(0, 2)).put(spans(0, 3))))
            .put(JSONObject().put("offset", 40 + 24 + 9).put("source_offset", bOffset).put("dtype", "<f2").put("shape", JSONArray(listOf(12, 5)))
                .put("index", JSONArray().put(spans(0, 2, 4, 6, 8, 10)).put(spans(0, 5))))
        val recipe = JSONObject().put("schema", "hydra-edge/recipe").put("schema_version", 1).put("heads", 3).put("artefact", "h3.tflite")
            .put("skeleton", piece("h3.skeleton", header + middle + trailer)).put("source", piece("h12.tflite", source)).put("ranges", ranges)
        fun record(heads: Int, file: String, data: ByteArray, compact: Boolean) = JSONObject().put("id", "h${heads}_tflite_int8").put("heads", heads)
            .put("format", "tflite").put("file", file).put("bytes", data.size).put("sha256", Rebuild.sha256Hex(data)).put("threads", 4)
            .put("runtime", "ai-edge-litert").put("compact", if (compact) JSONObject().put("recipe", "h3.recipe.json").put("sha256", "0".repeat(64)) else JSONObject.NULL)
        val manifest = JSONObject().put("schema", "hydra-edge/bundle").put("schema_version", 1)
            .put("artefacts", JSONArray().put(record(3, "h3.tflite", artefact, true)).put(record(12, "h12.tflite", source, false)))
        return Bundle(dir, artefact, recipe, manifest).also { it.write() }
    }

    private fun refused(b: Bundle, heads: Int = 3): String =
        assertThrows(BundleException::class.java) { Rebuild.artefactBytes(b.dir, b.read(), heads) }.message!!.also {
            assertFalse(it.contains('\n'), it)
        }

    private fun edited(json: JSONObject, edit: (JSONObject) -> Unit) = JSONObject(json.toString()).also(edit)
    private fun JSONObject.range(i: Int) = getJSONArray("ranges").getJSONObject(i)

    @Test
    fun `a hand-made compact bundle is rebuilt byte for byte and the whole artefact read as it is`(@TempDir dir: File) {
        val b = bundle(dir)
        val manifest = b.read()
        assertEquals(listOf(3), Rebuild.compactHeads(manifest))
        assertArrayEquals(b.artefact, Rebuild.artefactBytes(dir, manifest, 3))
        assertArrayEquals(File(dir, "h12.tflite").readBytes(), Rebuild.artefactBytes(dir, manifest, 12))
        assertTrue(assertThrows(BundleException::class.java) { Rebuild.artefactBytes(dir, manifest, 6) }.message!!.contains("no artefact with 6 heads"))
    }

    @Test
    fun `a path leaving the bundle is refused wherever a record names one`(@TempDir dir: File) {
        val b = bundle(dir)
        val bad = listOf("../h12.tflite", "/etc/hostname", "sub/../../x", "a\u0000b", "a\\b", "~/x", "")
        for (name in bad) {
            for ((field, edit) in listOf<Pair<String, (JSONObject) -> Unit>>(
                "$.skeleton.file" to { r -> r.getJSONObject("skeleton").put("file", name) },
                "$.source.file" to { r -> r.getJSONObject("source").put("file", name) },
                "$.artefact" to { r -> r.put("artefact", name) })) {
                b.write(recipe = edited(b.recipe, edit))
                val e = assertThrows(BundleException::class.java) { Rebuild.artefactBytes(dir, b.read(), 3) }
                assertEquals(field, e.path, "$field = '$name'")
                assertTrue(e.message!!.startsWith(b.recipeFile.path + ": "), e.message)
            }
            b.write(recipe = b.recipe, manifest = edited(b.manifest) { m -> m.getJSONArray("artefacts").getJSONObject(0).put("file", name) })
            assertEquals("$.artefacts[0].file", assertThrows(BundleException::class.java) { b.read() }.path, name)
            val compact = edited(b.manifest) { m ->
                m.getJSONArray("artefacts").getJSONObject(0).put("compact", JSONObject().put("recipe", name).put("sha256", "0".repeat(64)).put("keep_sha256", true))
            }
            b.write(manifest = compact)
            assertEquals("$.artefacts[0].compact.recipe", assertThrows(BundleException::class.java) { b.read() }.path, name)
        }
        b.write(manifest = edited(b.manifest) { m -> m.getJSONArray("artefacts").getJSONObject(0).getJSONObject("compact").put("extra", 1) })
        assertEquals("$.artefacts[0].compact", assertThrows(BundleException::class.java) { b.read() }.path)
    }

    @Test
    fun `a file linked to outside the bundle is refused though its bytes are right`(@TempDir dir: File) {
        val b = bundle(File(dir, "bundle").also { it.mkdir() })
        val skeleton = File(b.dir, "h3.skeleton")
        val outside = File(dir, "private.skeleton")
        skeleton.renameTo(outside)
        Files.createSymbolicLink(skeleton.toPath(), outside.toPath())
        assertTrue(refused(b).startsWith("${skeleton.path} is a link to ${outside.canonicalPath}, outside the bundle (skeleton)"))
        Files.delete(skeleton.toPath())
        Files.createSymbolicLink(skeleton.toPath(), File("sub/../h3.inside").toPath()) // a link inside the bundle is fine
        outside.copyTo(File(b.dir, "h3.inside"))
        File(b.dir, "sub").mkdir()
        assertArrayEquals(b.artefact, Rebuild.artefactBytes(b.dir, b.read(), 3))
    }

    @Test
    fun `numbers beyond Python's bounds are refused at their field`(@TempDir dir: File) {
        val b = bundle(dir)
        val cases = listOf<Triple<String, String, (JSONObject) -> Unit>>(
            Triple("$.skeleton.bytes", "<= ${1L shl 53}", { r -> r.getJSONObject("skeleton").put("bytes", (1L shl 53) + 1) }),
            Triple("$.skeleton.bytes", ">= 0", { r -> r.getJSONObject("skeleton").put("bytes", -1) }),
            Triple("$.ranges[0].offset", "expected `int`", { r -> r.range(0).put("offset", java.math.BigInteger.valueOf(2).pow(64)) }),
            Triple("$.ranges[0].shape[1]", "<= ${1L shl 40}", { r -> r.range(0).put("shape", JSONArray(listOf(4, (1L shl 40) + 1))) }),
            Triple("$.ranges[0].shape[0]", ">= 1", { r -> r.range(0).put("shape", JSONArray(listOf(0, 6))) }),
            Triple("$.ranges[0].shape", "length <= 32", { r -> r.range(0).put("shape", JSONArray(List(33) { 1 })) }),
            Triple("$.ranges[0].index", "2 axes for a tensor of shape", { r -> r.range(0).put("shape", JSONArray(listOf(4, 6, 1))) }),
            Triple("$.ranges[0].index[1]", "not inside an axis of 6", { r -> r.range(0).getJSONArray("index").put(1, JSONArray().put(JSONArray(listOf(3, 7)))) }),
            Triple("$.ranges[0].index[1]", "no span", { r -> r.range(0).getJSONArray("index").put(1, JSONArray()) }),
            Triple("$.ranges[0].index[1][0]", "length 2", { r -> r.range(0).getJSONArray("index").put(1, JSONArray().put(JSONArray(listOf(0, 1, 2)))) }),
            Triple("$.ranges[0].dtype", "matching regex", { r -> r.range(0).put("dtype", "<f1") }),
            Triple("$.ranges[0].dtype", "matching regex", { r -> r.range(0).put("dtype", "<f4\n") }),
            Triple("$.ranges[1].offset", "overlaps the range before it", { r -> r.range(1).put("offset", 50) }),
            Triple("$.heads", "<= 128", { r -> r.put("heads", 129) }),
            Triple("$.ranges[0]", "unknown field `extra`", { r -> r.range(0).put("extra", 1) }),
            Triple("$.ranges[0].shape[0]", "got `bool`", { r -> r.range(0).put("shape", JSONArray(listOf(true, 6))) }))
        for ((path, words, edit) in cases) {
            b.write(recipe = edited(b.recipe, edit))
            val e = assertThrows(BundleException::class.java) { Rebuild.artefactBytes(dir, b.read(), 3) }
            assertEquals(path, e.path, e.message)
            assertTrue(e.message!!.contains(words), e.message)
        }
    }

    @Test
    fun `a range out of its source or its artefact is refused before either is read`(@TempDir dir: File) {
        val b = bundle(dir)
        File(dir, "h3.skeleton").delete()
        val sourceBytes = b.recipe.getJSONObject("source").getLong("bytes")
        b.write(recipe = edited(b.recipe) { r -> r.range(1).put("source_offset", sourceBytes - 10) })
        assertTrue(refused(b).startsWith("${b.recipeFile.path}: range 1 reads source bytes [${sourceBytes - 10}, "))
        b.write(recipe = edited(b.recipe) { r -> r.range(1).put("source_offset", 1L shl 53).put("shape", JSONArray(listOf(1L shl 40, 1L shl 40))) })
        assertTrue(refused(b).contains("range 1 reads source bytes"))  // a size no Long holds is still beyond
        // the holes moved past the skeleton's bytes: the total is kept, the last hole is fed by no skeleton byte
        b.write(recipe = edited(b.recipe) { r -> r.range(1).put("offset", 40 + 24 + 22 + 1) })
        assertTrue(refused(b).contains("range 1 writes bytes ["), "refused before the missing skeleton is read")
    }

    @Test
    fun `sizes beyond what a phone can hold are refused before anything is read`(@TempDir dir: File) {
        val b = bundle(dir)
        val huge = 3L shl 30
        java.io.RandomAccessFile(File(dir, "h3.skeleton"), "rw").use { it.setLength(huge) } // sparse: no disk, never read
        b.write(recipe = edited(b.recipe) { r -> r.getJSONObject("skeleton").put("bytes", huge) },
            manifest = edited(b.manifest) { m -> m.getJSONArray("artefacts").getJSONObject(0).put("bytes", huge + 24 + 60) })
        val line = refused(b)
        assertTrue(line.contains("more than the ${Rebuild.ARTEFACT_MAX_BYTES}"), line)
        // a size the manifest disagrees with
        b.write(recipe = b.recipe, manifest = edited(b.manifest) { m -> m.getJSONArray("artefacts").getJSONObject(0).put("bytes", 1L shl 53) })
        assertTrue(refused(b).contains("the manifest names h3.tflite (3 heads, ${1L shl 53} bytes)"))
        // a recipe larger than any record
        val padded = b.recipe.toString() + " ".repeat((8 shl 20) + 1)
        b.recipeFile.writeText(padded)
        val m = edited(b.manifest) { mm -> mm.getJSONArray("artefacts").getJSONObject(0).getJSONObject("compact").put("sha256", Rebuild.sha256Hex(padded.toByteArray())) }
        File(dir, "manifest.json").writeText(m.toString())
        assertTrue(refused(b).contains("is larger than ${8 shl 20} bytes"))
    }

    @Test
    fun `every tampered piece is one line naming its file and nothing is returned`(@TempDir dir: File) {
        val b = bundle(dir)
        val skeleton = File(dir, "h3.skeleton")
        val source = File(dir, "h12.tflite")
        fun flip(f: File) { val d = f.readBytes(); d[d.size / 2] = (d[d.size / 2].toInt() xor 1).toByte(); f.writeBytes(d) }
        val keep = skeleton.readBytes()
        flip(skeleton)
        assertTrue(refused(b).startsWith("${skeleton.path}: skeleton sha256 is "))
        skeleton.writeBytes(keep.copyOf(keep.size - 1))
        assertTrue(refused(b).startsWith("${skeleton.path}: skeleton is ${keep.size - 1} bytes, the recipe says ${keep.size}"))
        skeleton.delete()
        assertTrue(refused(b).startsWith("${skeleton.path}: skeleton is missing"))
        skeleton.mkdir()
        assertTrue(refused(b).startsWith("${skeleton.path}: skeleton is not a regular file"))
        skeleton.delete(); skeleton.writeBytes(keep)
        val sourceBytes = source.readBytes()
        flip(source)
        assertTrue(refused(b).startsWith("${source.path}: source artefact sha256 is "))
        assertTrue(refused(b, 12).startsWith("${source.path} is missing or its sha256 differs from the manifest"))
        source.writeBytes(sourceBytes)
        flip(b.recipeFile)
        assertTrue(refused(b).startsWith("${b.recipeFile.path}: recipe sha256 is "))
        b.write()
        b.write(manifest = edited(b.manifest) { m -> m.getJSONArray("artefacts").getJSONObject(0).put("sha256", "0".repeat(64)) })
        assertTrue(refused(b).startsWith("${b.recipeFile.path}: artefact h3.tflite rebuilt by the recipe sha256 is "))
        b.write()
        assertArrayEquals(b.artefact, Rebuild.artefactBytes(dir, b.read(), 3)) // all restored: rebuilt again
    }
}
