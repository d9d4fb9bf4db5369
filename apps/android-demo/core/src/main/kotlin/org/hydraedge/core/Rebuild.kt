package org.hydraedge.core

import java.io.File
import java.io.IOException
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.channels.FileChannel
import java.security.MessageDigest

/**
 * A head count's artefact bytes from the bundle, as hydra_edge.runtime.rebuild gives them to a board's
 * runtime: read whole (a full artefact) or rebuilt from a compact bundle's skeleton + recipe over the
 * largest artefact's bytes, and returned only once their sha256 is the manifest's.
 *
 * Nothing is trusted before it is checked: the recipe's sha256 is the manifest's before it is decoded,
 * its head count, artefact and size are the record's, every range lies inside its source and inside the
 * rebuilt file before a byte of either is read, the skeleton's and the source's sizes are compared
 * before they are read and their sha256 after, and the rebuilt bytes' sha256 is the manifest's before
 * they are returned. A file linked to outside the bundle, a folder or a FIFO in a file's place, and a
 * file larger than its record says are refused without being read. Each refusal is one
 * [BundleException] line naming the file and what to do; nothing is returned then, not even part.
 *
 * One limit is this library's own: a JVM array holds at most [ARTEFACT_MAX_BYTES] bytes (2 GiB), so
 * an artefact or a source larger than that is refused (Python's limit for a whole artefact is 4 GiB;
 * no phone loads either).
 */
object Rebuild {
    const val FIX = "re-push the bundle or re-run hydra-edge convert"

    /** The largest artefact this library reads or rebuilds: the JVM's largest array (Python's is 4 GiB). */
    const val ARTEFACT_MAX_BYTES: Long = Int.MAX_VALUE - 8L

    /** The head counts whose artefact [manifest] keeps as a recipe (rebuilt), in the manifest's order. */
    fun compactHeads(manifest: Manifest): List<Int> = manifest.artefacts.filter { it.compact != null }.map { it.heads }.distinct()

    /** The one artefact of [manifest] with [heads] heads; a [BundleException] naming the manifest if none or several. */
    fun record(bundle: File, manifest: Manifest, heads: Int): ManifestArtefact {
        val found = manifest.artefacts.filter { it.heads == heads }
        val where = File(bundle, Manifest.FILE).path
        if (found.isEmpty()) throw BundleException("$where has no artefact with $heads heads (it has ${manifest.artefacts.map { it.heads }}); " +
            "choose one of those or re-run hydra-edge convert with --heads including $heads")
        if (found.size > 1) throw BundleException("$where has ${found.size} artefacts with $heads heads (${found.map { it.id }}); " +
            "pick one by its record: Rebuild.artefactBytes(bundle, record)")
        return found[0]
    }

    /** The verified bytes of the artefact with [heads] heads: read whole, or rebuilt from its recipe. */
    fun artefactBytes(bundle: File, manifest: Manifest, heads: Int): ByteArray = artefactBytes(bundle, record(bundle, manifest, heads))

    /** The verified bytes of [record]'s artefact, from its file or rebuilt (runtime.rebuild.artefact_bytes). */
    fun artefactBytes(bundle: File, record: ManifestArtefact): ByteArray =
        if (record.compact == null) whole(bundle, record) else rebuild(bundle, record)

    /** A full artefact's file, read once (at most the manifest's size) and hashed: the bytes checked are the bytes returned. */
    private fun whole(bundle: File, record: ManifestArtefact): ByteArray {
        val file = bundlePath(bundle, record.file, "artefact")
        val data = Records.readBytes(file, "artefact", FIX, max = minOf(record.bytes, ARTEFACT_MAX_BYTES)) { BundleException(it) }
        if (sha256Hex(data) != record.sha256) throw BundleException("${file.path} is missing or its sha256 differs from the manifest; $FIX")
        return data
    }

    /** The recipe of [record], checked against the manifest's sha256, head count, file name and size. */
    fun recipeOf(bundle: File, record: ManifestArtefact): Recipe {
        val compact = record.compact ?: throw IllegalArgumentException("artefact ${record.id} is no compact record")
        val file = bundlePath(bundle, compact.recipe, "recipe")
        val data = Records.readBytes(file, "recipe", FIX) { BundleException(it) }
        checkSha256(sha256Hex(data), file, "recipe", compact.sha256)
        val recipe = Recipe.decode(data, file.path)
        if (recipe.heads != record.heads || recipe.artefact != record.file || recipe.rebuiltBytes() != record.bytes)
            throw BundleException("${file.path}: rebuilds ${recipe.artefact} (${recipe.heads} heads, ${recipe.rebuiltBytes()} bytes), " +
                "the manifest names ${record.file} (${record.heads} heads, ${record.bytes} bytes); $FIX")
        return recipe
    }

    /** The bytes of [record]'s artefact, rebuilt from its recipe; their sha256 is the manifest's. */
    fun rebuild(bundle: File, record: ManifestArtefact): ByteArray {
        val recipe = recipeOf(bundle, record)
        val where = File(bundle, record.compact!!.recipe)
        checkRanges(recipe, where)
        val skeletonFile = bundlePath(bundle, recipe.skeleton.file, "skeleton")
        checkSize(skeletonFile, recipe.skeleton, "skeleton") // first, as Python: a file of another size is named as such
        val total = recipe.rebuiltBytes()
        if (total > ARTEFACT_MAX_BYTES) throw tooLarge(where, "artefact ${record.file} rebuilt by the recipe", total)
        val skeleton = readPiece(skeletonFile, recipe.skeleton)
        val source = mapSource(bundle, recipe.source)
        val out = ByteArray(total.toInt())
        splice(skeleton, source, recipe.ranges, out)
        checkSha256(sha256Hex(out), where, "artefact ${record.file} rebuilt by the recipe", record.sha256)
        return out
    }

    /** Every range inside its source tensor's file and inside the rebuilt file, fed by skeleton bytes in
     *  order (ordered and apart: [Recipe.decode] checked that). */
    private fun checkRanges(recipe: Recipe, where: File) {
        val total = recipe.rebuiltBytes()
        var holes = 0L
        recipe.ranges.forEachIndexed { i, r ->
            val sourceEnd = Sizes.plus(r.sourceOffset, r.sourceBytes())
            if (sourceEnd > recipe.source.bytes)
                throw BundleException("${where.path}: range $i reads source bytes [${r.sourceOffset}, $sourceEnd) beyond " +
                    "${recipe.source.file} (${recipe.source.bytes} bytes); $FIX")
            val end = Sizes.plus(r.offset, r.holeBytes())
            if (r.offset - holes > recipe.skeleton.bytes || end > total)
                throw BundleException("${where.path}: range $i writes bytes [${r.offset}, $end) outside the $total-byte artefact " +
                    "its skeleton and holes make; $FIX")
            holes = Sizes.plus(holes, r.holeBytes())
        }
    }

    /** A skeleton whose size was checked: read once (at most the recipe's size) and its sha256 checked. */
    private fun readPiece(file: File, piece: Piece): ByteArray {
        val data = Records.readBytes(file, "skeleton", FIX, max = piece.bytes) { BundleException(it) }
        checkSha256(sha256Hex(data), file, "skeleton", piece.sha256)
        return data
    }

    /** Sources whose sha256 this process has checked, by file identity (canonical path, size, modification
     *  time), as Python keeps them: the source is read for every head count. The rebuilt bytes are always hashed. */
    private val verified = java.util.Collections.synchronizedMap(HashMap<Triple<String, Long, Long>, String>())

    /** The source artefact, mapped read-only (a rebuild reads only the slices it takes); its sha256 checked
     *  on first use and whenever its identity changes. */
    private fun mapSource(bundle: File, piece: Piece): ByteBuffer {
        val file = bundlePath(bundle, piece.file, "source artefact")
        checkSize(file, piece, "source artefact")
        if (piece.bytes > ARTEFACT_MAX_BYTES) throw tooLarge(file, "source artefact", piece.bytes)
        val map = try {
            RandomAccessFile(file, "r").use { raf ->
                if (raf.length() != piece.bytes) throw BundleException("${file.path}: source artefact is ${raf.length()} bytes, the recipe says ${piece.bytes}; $FIX")
                raf.channel.map(FileChannel.MapMode.READ_ONLY, 0, piece.bytes)
            }
        } catch (e: IOException) {
            throw BundleException("${file.path}: cannot read source artefact: ${e.message}; $FIX")
        }
        val key = Triple(file.canonicalPath, file.length(), file.lastModified())
        if (verified[key] != piece.sha256) {
            val digest = MessageDigest.getInstance("SHA-256")
            digest.update(map.duplicate())
            checkSha256(hex(digest.digest()), file, "source artefact", piece.sha256)
            verified[key] = piece.sha256
        }
        return map
    }

    /** The rebuilt file into [out]: skeleton bytes in order, each range's slice in its hole. */
    private fun splice(skeleton: ByteArray, source: ByteBuffer, ranges: List<Range>, out: ByteArray) {
        var read = 0 // next skeleton byte
        var written = 0 // next output byte
        for (r in ranges) {
            val gap = (r.offset - written).toInt()
            System.arraycopy(skeleton, read, out, written, gap)
            read += gap
            written += gap
            written = gather(source, r, out, written)
        }
        System.arraycopy(skeleton, read, out, written, skeleton.size - read)
    }

    /**
     * The range's spans of its source tensor, in C order, copied into [out] at [at]; returns where the
     * copy ends. Axes after the last one that is not taken whole are copied as one block per span.
     */
    private fun gather(source: ByteBuffer, r: Range, out: ByteArray, at: Int): Int {
        val n = r.shape.size
        val stride = LongArray(n)
        var s = r.itemsize.toLong()
        for (a in n - 1 downTo 0) { stride[a] = s; s *= r.shape[a] }
        var last = n - 1 // the deepest axis not taken whole; those after it are one block per span
        while (last > 0 && r.index[last].size == 1 && r.index[last][0][0] == 0L && r.index[last][0][1] == r.shape[last]) last--
        val src = source.duplicate()
        var pos = at
        fun walk(axis: Int, base: Long) {
            for (span in r.index[axis]) {
                if (axis == last) {
                    val length = ((span[1] - span[0]) * stride[axis]).toInt()
                    src.position((base + span[0] * stride[axis]).toInt())
                    src.get(out, pos, length)
                    pos += length
                } else {
                    for (i in span[0] until span[1]) walk(axis + 1, base + i * stride[axis])
                }
            }
        }
        if (n == 0) { // a scalar: one item
            src.position(r.sourceOffset.toInt()); src.get(out, pos, r.itemsize); return pos + r.itemsize
        }
        walk(0, r.sourceOffset)
        return pos
    }

    /** The bundle file [name] ([what] it is): a link leading out of the bundle is refused before anything is read. */
    fun bundlePath(bundle: File, name: String, what: String): File {
        Checks.relativePath(name, what) { _, message -> throw BundleException("${File(bundle, name).path}: $what: $message; $FIX") }
        val file = File(bundle, name)
        val resolved = try { file.canonicalFile } catch (e: IOException) { throw BundleException("${file.path}: cannot read $what: ${e.message}; $FIX") }
        val root = try { bundle.canonicalFile } catch (e: IOException) { throw BundleException("${bundle.path}: cannot read the bundle: ${e.message}; $FIX") }
        if (!resolved.path.startsWith(root.path.trimEnd('/') + "/"))
            throw BundleException("${file.path} is a link to ${resolved.path}, outside the bundle ($what); a bundle holds its " +
                "own files: replace the link with the file or re-run hydra-edge convert")
        return file
    }

    private fun checkSize(file: File, piece: Piece, what: String) {
        if (!file.exists()) throw BundleException("${file.path}: $what is missing; $FIX")
        if (!file.isFile) throw BundleException("${file.path}: $what is not a regular file (a FIFO, a folder or a device); $FIX")
        val size = file.length()
        if (size != piece.bytes) throw BundleException("${file.path}: $what is $size bytes, the recipe says ${piece.bytes}; $FIX")
    }

    private fun checkSha256(got: String, file: File, what: String, sha256: String) {
        if (got != sha256) throw BundleException("${file.path}: $what sha256 is ${got.take(12)}..., expected ${sha256.take(12)}...; $FIX")
    }

    private fun tooLarge(file: File, what: String, bytes: Long) =
        BundleException("${file.path}: $what is $bytes bytes, more than the $ARTEFACT_MAX_BYTES this library can hold in memory; " +
            "convert fewer heads or a smaller model for a phone, or $FIX")

    fun sha256Hex(data: ByteArray): String = hex(MessageDigest.getInstance("SHA-256").digest(data))

    private fun hex(digest: ByteArray): String {
        val chars = "0123456789abcdef"
        val sb = StringBuilder(digest.size * 2)
        for (b in digest) { sb.append(chars[(b.toInt() shr 4) and 15]); sb.append(chars[b.toInt() and 15]) }
        return sb.toString()
    }
}
