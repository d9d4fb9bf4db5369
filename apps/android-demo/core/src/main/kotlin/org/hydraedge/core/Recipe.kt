package org.hydraedge.core

/** One file a rebuild reads (skeleton or source), with the size and sha256 it must have. */
data class Piece(val file: String, val sha256: String, val bytes: Long)

/**
 * A hole at [offset] of the rebuilt file, filled from a tensor of the source: the tensor ([itemsize]
 * bytes an item, [shape], C order) starts at [sourceOffset] of the source file; [index] gives, per
 * axis, the `[start, stop)` spans to keep, in order.
 */
class Range(val offset: Long, val sourceOffset: Long, val dtype: String, val shape: LongArray, val index: List<List<LongArray>>) {
    val itemsize: Int = dtype[2].digitToInt()

    /** Bytes of the whole source tensor (saturating at Long.MAX_VALUE: Python's ints never overflow, and
     *  any sum this large is refused below as it is there). */
    fun sourceBytes(): Long = shape.fold(itemsize.toLong()) { n, size -> Sizes.times(n, size) }

    /** Bytes the slice fills in the rebuilt file (saturating, as [sourceBytes]). */
    fun holeBytes(): Long = index.fold(itemsize.toLong()) { n, spans -> Sizes.times(n, spans.fold(0L) { s, span -> Sizes.plus(s, span[1] - span[0]) }) }
}

/**
 * A compact bundle's `*.recipe.json` (schema `hydra-edge/recipe` v1): skeleton + slices of the source
 * give the artefact the manifest names, byte for byte. Read as hydra_edge.records.recipe reads it:
 * every field typed and bounded, unknown fields refused, paths inside the bundle, ranges ordered and apart.
 */
class Recipe(val heads: Int, val artefact: String, val skeleton: Piece, val source: Piece, val ranges: List<Range>) {
    /** Size of the rebuilt artefact: the skeleton plus every hole (saturating). */
    fun rebuiltBytes(): Long = ranges.fold(skeleton.bytes) { n, r -> Sizes.plus(n, r.holeBytes()) }

    companion object {
        const val SCHEMA = "hydra-edge/recipe"
        const val HINT = "re-run hydra-edge convert --layout compact into a new folder"
        const val NON_NEGATIVE_MAX = 1L shl 53 // records.fields.NonNegative
        const val POSITIVE_MAX = 1L shl 40 // records.fields.Positive
        const val MAX_AXES = 32 // records.recipe.MAX_AXES
        // records.recipe.Dtype, without the final newline Python's `$` lets through: numpy cannot read "<f4\n",
        // so Python's rebuild fails on such a recipe (with a TypeError); here it is refused at its field
        private val DTYPE = java.util.regex.Pattern.compile("[<>|](f[248]|[iu][1248]|b1)") // java.util.regex: kotlin.text.Regex holds lambdas dx cannot dex for Android

        /** A recipe's bytes as a checked [Recipe]; one [BundleException] line naming [where] otherwise. */
        fun decode(data: ByteArray, where: String): Recipe {
            val fail: (String, String) -> Nothing = { path, message -> throw BundleException("$where: $path: $message; $HINT", path) }
            val root = Records.header(data, where, "recipe", HINT, SCHEMA, 1) { m, p -> BundleException(m, p) }
            val f = Fields(root, "$", fail)
            val heads = f.long("heads", 1, Checks.MAX_HEADS).toInt()
            val artefact = f.name("artefact")
            val skeleton = piece(f.obj("skeleton"), fail)
            val source = piece(f.obj("source"), fail)
            val ranges = Checks.list(f.array("ranges"), f.at("ranges"), fail = fail) { v, at -> range(Fields(Checks.obj(v, at, fail), at, fail), fail) }
            f.string("schema"); f.long("schema_version", Long.MIN_VALUE, Long.MAX_VALUE)
            f.noOthers()
            Checks.relativePath(artefact, "$.artefact", fail)
            var end = 0L
            ranges.forEachIndexed { i, r ->
                if (r.offset < end) fail("$.ranges[$i].offset", "${r.offset} overlaps the range before it (ends at $end)")
                end = Sizes.plus(r.offset, r.holeBytes())
            }
            return Recipe(heads, artefact, skeleton, source, ranges)
        }

        private fun piece(p: Fields, fail: (String, String) -> Nothing): Piece {
            val piece = Piece(p.string("file"), p.sha256("sha256"), p.long("bytes", 0, NON_NEGATIVE_MAX))
            p.noOthers()
            Checks.relativePath(piece.file, p.at("file"), fail)
            return piece
        }

        private fun range(r: Fields, fail: (String, String) -> Nothing): Range {
            val offset = r.long("offset", 0, NON_NEGATIVE_MAX)
            val sourceOffset = r.long("source_offset", 0, NON_NEGATIVE_MAX)
            val dtype = r.string("dtype")
            if (!DTYPE.matcher(dtype).matches()) fail(r.at("dtype"), "expected `str` matching regex '^[<>|](f[248]|[iu][1248]|b1)$'")
            val shape = Checks.list(r.array("shape"), r.at("shape"), maxLength = MAX_AXES, fail = fail) { v, at ->
                Checks.long(v, at, 1, POSITIVE_MAX, fail)
            }.toLongArray()
            val index = Checks.list(r.array("index"), r.at("index"), maxLength = MAX_AXES, fail = fail) { axis, atAxis ->
                Checks.list(Checks.array(axis, atAxis, fail), atAxis, fail = fail) { span, at ->
                    val pair = Checks.array(span, at, fail)
                    if (pair.length() != 2) fail(at, "expected `array` of length 2")
                    longArrayOf(Checks.long(pair.get(0), "$at[0]", 0, NON_NEGATIVE_MAX, fail),
                        Checks.long(pair.get(1), "$at[1]", 1, POSITIVE_MAX, fail))
                }
            }
            r.noOthers()
            if (index.size != shape.size) fail(r.at("index"), "${index.size} axes for a tensor of shape ${shape.toList()}")
            index.forEachIndexed { axis, spans ->
                if (spans.isEmpty()) fail("${r.at("index")}[$axis]", "no span")
                for (span in spans) if (!(span[0] < span[1] && span[1] <= shape[axis]))
                    fail("${r.at("index")}[$axis]", "span [${span[0]}, ${span[1]}) is not inside an axis of ${shape[axis]}")
            }
            return Range(offset, sourceOffset, dtype, shape, index)
        }
    }
}

/** Sizes in Long that saturate instead of wrapping: a recipe's numbers are bounded, their products are not. */
object Sizes {
    fun plus(a: Long, b: Long): Long = if (a > Long.MAX_VALUE - b) Long.MAX_VALUE else a + b
    fun times(a: Long, b: Long): Long = if (a != 0L && b > Long.MAX_VALUE / a) Long.MAX_VALUE else a * b
}
