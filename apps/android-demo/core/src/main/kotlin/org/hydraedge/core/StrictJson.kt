package org.hydraedge.core

import org.json.JSONArray
import org.json.JSONObject
import java.math.BigInteger
import java.nio.ByteBuffer
import java.nio.charset.CharacterCodingException
import java.nio.charset.CodingErrorAction
import java.nio.charset.StandardCharsets

/**
 * A record that cannot be used: one line naming the file, the field path (`$.candidates[2].heads`),
 * what is wrong and how to fix it, as hydra_edge.records.codec words it on a board.
 *
 * [path] is the field path alone, so tests (and the parity test against Python) can compare it. Both are
 * [printable]: a key or value quoted from the file cannot break the one line.
 */
open class RecordException(message: String, path: String? = null) : Exception(printable(message)) {
    val path: String? = path?.let { printable(it) }
}

/**
 * [text] with each control character, line separator or lone surrogate as Python writes it in a repr (`\n`,
 * `\x00`, `\u2028`, `\ud800`): hydra_edge.records.codec.printable, so both readers name a field alike.
 */
fun printable(text: String): String {
    val out = StringBuilder(text.length)
    var i = 0
    while (i < text.length) {
        val c = text[i]
        val paired = c.isHighSurrogate() && i + 1 < text.length && text[i + 1].isLowSurrogate()
        when {
            paired -> { out.append(c).append(text[i + 1]); i++ }
            c == '\t' -> out.append("\\t")
            c == '\n' -> out.append("\\n")
            c == '\r' -> out.append("\\r")
            c < ' ' || c in '\u007f'..'\u009f' -> out.append("\\x%02x".format(c.code))
            c == '\u2028' || c == '\u2029' || c.isSurrogate() -> out.append("\\u%04x".format(c.code))
            else -> out.append(c)
        }
        i++
    }
    return out.toString()
}

/** `lut.json` cannot be used with this bundle: missing, damaged, foreign or mismatched (Python's `LutError`). */
class LutException(message: String, path: String? = null) : RecordException(message, path)

/** A latency correction that cannot be used (Python's `CorrectionError`). */
class CorrectionException(message: String, path: String? = null) : RecordException(message, path)

/** A bundle file (manifest, recipe, artefact) that cannot be used; nothing is loaded from it. */
class BundleException(message: String, path: String? = null) : RecordException(message, path)

/**
 * A JSON parser as strict as msgspec's, building org.json trees.
 *
 * Why not `JSONObject(String)`: org.json's tokenizer accepts unquoted keys and strings, single
 * quotes, trailing commas and `NaN`; hydra_edge.records.codec.parse (what Python's device code
 * reads records with) accepts exactly RFC 8259 JSON in UTF-8, no lone surrogate escape, at most
 * [MAX_DEPTH] arrays and objects deep, and no key twice in one object. A record Python refuses
 * must be refused here, at the same field, and one Python reads must be read here, so the grammar
 * is checked here and org.json only holds the values (Android ships the same org.json API, so
 * nothing is bundled for it). Integers become Long (BigInteger beyond), other numbers Double; a
 * number too large for a double is refused, as Python refuses it. The first fault is found in
 * Python's order: the UTF-8, the grammar (anywhere), then the field holding NaN, an infinity or
 * too large a number (the last one), then the first repeated key in document order.
 */
object StrictJson {
    /** hydra_edge.records.codec.MAX_DEPTH: more arrays and objects open at once is refused, before a stack overflows. */
    const val MAX_DEPTH = 512

    /** The longest integer Python's reader takes (msgspec, at Python's default int_max_str_digits), sign included. */
    const val MAX_INT_CHARS = 4300

    /**
     * Each parsed object's keys in document order (by identity): org.json's JSONObject keeps no order,
     * and an unknown field is named as Python names it, the first one in the document ([Fields.noOthers]).
     */
    internal val keyOrder: MutableMap<JSONObject, List<String>> =
        java.util.Collections.synchronizedMap(java.util.WeakHashMap())

    /** [path]: the field a non-finite or out-of-range number is at (as Python names it), else null. */
    class SyntaxError(message: String, val path: String? = null) : Exception(message)

    /** UTF-8 bytes as text; invalid UTF-8 is refused (msgspec refuses it too). */
    fun utf8(data: ByteArray): String {
        val decoder = StandardCharsets.UTF_8.newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT)
        try {
            return decoder.decode(ByteBuffer.wrap(data)).toString()
        } catch (e: CharacterCodingException) {
            throw SyntaxError("invalid UTF-8")
        }
    }

    /** Parse a whole document: a JSONObject, JSONArray, String, Long, BigInteger, Double, Boolean or JSONObject.NULL. */
    fun parse(text: String): Any {
        val strict = Parser(text, false)
        val value = try {
            strict.document()
        } catch (e: SyntaxError) {
            // Python's writer spells NaN and Infinity; its reader then names the field that holds one
            // (records.codec._non_finite), or a number too large for a double. Found by a second,
            // lenient parse (Python's json: lone surrogates pass there too): the last one in the document.
            val lenient = Parser(text, true)
            try { lenient.document() } catch (_: SyntaxError) { throw e }
            if (lenient.nonFinite.isNotEmpty()) {
                val (path, word) = lenient.nonFinite.last()
                throw SyntaxError("$word is not a finite number", path)
            }
            throw e
        }
        strict.repeated?.let { (path, key) -> throw SyntaxError("key `$key` appears twice in one object (a record has one value per key)", path) }
        return value
    }

    private class Parser(val s: String, val lenient: Boolean) {
        var i = 0
        val path = ArrayList<String>()
        val nonFinite = ArrayList<Pair<String, String>>()
        /** The first key repeated in an object, in document order: (its path, the key). */
        var repeated: Pair<String, String>? = null

        fun document(): Any {
            ws()
            val value = value(0)
            ws()
            if (i != s.length) fail("trailing characters")
            return value
        }

        fun where(): String = "$" + path.joinToString("")

        fun ws() {
            while (i < s.length && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++
        }

        fun fail(what: String): Nothing = throw SyntaxError("$what at character $i")

        /** [depth]: the arrays and objects open around this value. */
        fun value(depth: Int): Any {
            if (i >= s.length) fail("unexpected end of input")
            if ((s[i] == '{' || s[i] == '[') && depth >= MAX_DEPTH) fail("arrays and objects nested more than $MAX_DEPTH deep")
            return when (s[i]) {
                '{' -> obj(depth)
                '[' -> arr(depth)
                '"' -> str()
                't' -> literal("true", true)
                'f' -> literal("false", false)
                'n' -> literal("null", JSONObject.NULL)
                else -> when {
                    lenient && (s.startsWith("NaN", i) || s.startsWith("Infinity", i) || s.startsWith("-Infinity", i)) -> {
                        val word = listOf("NaN", "Infinity", "-Infinity").first { s.startsWith(it, i) }
                        i += word.length
                        nonFinite.add(where() to mapOf("NaN" to "nan", "Infinity" to "inf", "-Infinity" to "-inf").getValue(word))
                        0.0
                    }
                    s[i] == '-' || s[i] in '0'..'9' -> num()
                    else -> fail("invalid character '${s[i]}'")
                }
            }
        }

        fun literal(word: String, v: Any): Any {
            if (!s.startsWith(word, i)) fail("invalid literal")
            i += word.length
            return v
        }

        fun obj(depth: Int): JSONObject {
            val o = JSONObject()
            val keys = ArrayList<String>()
            keyOrder[o] = keys
            i++
            ws()
            if (i < s.length && s[i] == '}') { i++; return o }
            while (true) {
                ws()
                if (i >= s.length || s[i] != '"') fail("expected a string key")
                val key = str()
                ws()
                if (i >= s.length || s[i] != ':') fail("expected ':'")
                i++
                ws()
                path.add(".$key")
                if (o.has(key)) { if (repeated == null) repeated = where() to key } else keys.add(key)
                o.put(key, value(depth + 1)) // a repeated key: refused once the whole text parses
                path.removeAt(path.size - 1)
                ws()
                if (i >= s.length) fail("unexpected end of input")
                if (s[i] == ',') { i++; continue }
                if (s[i] == '}') { i++; return o }
                fail("expected ',' or '}'")
            }
        }

        fun arr(depth: Int): JSONArray {
            val a = JSONArray()
            i++
            ws()
            if (i < s.length && s[i] == ']') { i++; return a }
            while (true) {
                ws()
                path.add("[${a.length()}]")
                a.put(value(depth + 1))
                path.removeAt(path.size - 1)
                ws()
                if (i >= s.length) fail("unexpected end of input")
                if (s[i] == ',') { i++; continue }
                if (s[i] == ']') { i++; return a }
                fail("expected ',' or ']'")
            }
        }

        fun str(): String {
            val b = StringBuilder()
            i++
            while (true) {
                if (i >= s.length) fail("unterminated string")
                val c = s[i++]
                when {
                    c == '"' -> return b.toString()
                    c == '\\' -> {
                        if (i >= s.length) fail("unterminated string")
                        when (val e = s[i++]) {
                            '"' -> b.append('"'); '\\' -> b.append('\\'); '/' -> b.append('/')
                            'b' -> b.append('\b'); 'f' -> b.append('\u000c'); 'n' -> b.append('\n')
                            'r' -> b.append('\r'); 't' -> b.append('\t')
                            'u' -> {
                                val c = hex4()
                                // a lone surrogate is no character: refused as Python's reader refuses it
                                // (its lenient second parse, Python's json, takes it)
                                if (!lenient && c.isLowSurrogate()) fail("lone surrogate escape")
                                if (!lenient && c.isHighSurrogate()) {
                                    if (!s.startsWith("\\u", i)) fail("lone surrogate escape")
                                    i += 2
                                    val low = hex4()
                                    if (!low.isLowSurrogate()) fail("lone surrogate escape")
                                    b.append(c).append(low)
                                } else b.append(c)
                            }
                            else -> fail("invalid escape '\\$e'")
                        }
                    }
                    c < ' ' -> fail("control character in a string")
                    else -> b.append(c)
                }
            }
        }

        /** The four hex digits of a \\u escape, as a UTF-16 unit. */
        fun hex4(): Char {
            if (i + 4 > s.length) fail("invalid \\u escape")
            val hex = s.substring(i, i + 4)
            if (!hex.all { it in '0'..'9' || it in 'a'..'f' || it in 'A'..'F' }) fail("invalid \\u escape")
            i += 4
            return hex.toInt(16).toChar()
        }

        fun num(): Any {
            val start = i
            if (s[i] == '-') i++
            if (i >= s.length) fail("invalid number")
            if (s[i] == '0') i++ else if (s[i] in '1'..'9') { while (i < s.length && s[i] in '0'..'9') i++ } else fail("invalid number")
            var integral = true
            if (i < s.length && s[i] == '.') {
                integral = false
                i++
                if (i >= s.length || s[i] !in '0'..'9') fail("invalid number")
                while (i < s.length && s[i] in '0'..'9') i++
            }
            if (i < s.length && (s[i] == 'e' || s[i] == 'E')) {
                integral = false
                i++
                if (i < s.length && (s[i] == '+' || s[i] == '-')) i++
                if (i >= s.length || s[i] !in '0'..'9') fail("invalid number")
                while (i < s.length && s[i] in '0'..'9') i++
            }
            val text = s.substring(start, i)
            if (integral) {
                // Python's reader (msgspec) reads no longer integer, its sign counted; its lenient second
                // parse (Python's json) none of more digits, the sign not counted
                val digits = if (lenient) text.removePrefix("-").length else text.length
                if (digits > MAX_INT_CHARS) fail("an integer of more than $MAX_INT_CHARS characters")
                val big = BigInteger(text)
                return if (big.bitLength() < 64) big.toLong() else big
            }
            val d = text.toDouble() // correctly rounded, as Python's float()
            if (d.isInfinite()) {
                if (!lenient) fail("number out of range")
                nonFinite.add(where() to if (d > 0) "inf" else "-inf")
                return 0.0
            }
            return d
        }
    }
}

/**
 * Typed, checked access to one JSON object of a record, every failure a [RecordException] naming
 * the field's path: the Kotlin side of msgspec's `Struct(forbid_unknown_fields=True)` with the
 * constrained types of hydra_edge.records.fields.
 */
class Fields(val obj: JSONObject, val path: String, private val fail: (String, String) -> Nothing) {
    private val used = HashSet<String>()

    fun has(key: String): Boolean = obj.has(key)

    private fun raw(key: String): Any {
        used.add(key)
        if (!obj.has(key)) fail(path, "object missing required field `$key`")
        return obj.get(key)
    }


    /** The value of an optional key (its default when absent), JSONObject.NULL for null. */
    private fun rawOr(key: String): Any? {
        used.add(key)
        return if (obj.has(key)) obj.get(key) else null
    }

    fun at(key: String) = "$path.$key"

    /** Refuse keys the record does not define: checked after the known ones, the first in the document named (as Python does). */
    fun noOthers() {
        for (key in StrictJson.keyOrder[obj] ?: obj.keySet().sorted()) if (key !in used) fail(path, "object contains unknown field `$key`")
    }

    fun string(key: String): String = raw(key).let { v -> Checks.string(v, at(key), fail) }
    fun optString(key: String): String? = rawOr(key).let { if (it == null || it == JSONObject.NULL) null else Checks.string(it, at(key), fail) }
    fun bool(key: String): Boolean = raw(key).let { v -> Checks.bool(v, at(key), fail) }
    fun long(key: String, lo: Long, hi: Long): Long = raw(key).let { v -> Checks.long(v, at(key), lo, hi, fail) }
    fun double(key: String, lo: Double, hi: Double, loOpen: Boolean = false): Double =
        raw(key).let { v -> Checks.double(v, at(key), lo, hi, loOpen, fail) }
    fun optDouble(key: String, lo: Double, hi: Double, loOpen: Boolean = false, required: Boolean = false): Double? {
        val v = if (required) raw(key) else rawOr(key)
        return if (v == null || v == JSONObject.NULL) null else Checks.double(v, at(key), lo, hi, loOpen, fail)
    }
    fun array(key: String): JSONArray = Checks.array(raw(key), at(key), fail)
    fun optArray(key: String): JSONArray? = rawOr(key).let { if (it == null || it == JSONObject.NULL) null else Checks.array(it, at(key), fail) }
    fun obj(key: String): Fields = Fields(Checks.obj(raw(key), at(key), fail), at(key), fail)
    fun optObj(key: String): Fields? = rawOr(key).let { if (it == null || it == JSONObject.NULL) null else Fields(Checks.obj(it, at(key), fail), at(key), fail) }
    /** An object with a default when absent: null then, but a JSON null is no object (Python's field is not Optional). */
    fun objIfGiven(key: String): Fields? = if (has(key)) obj(key) else null
    fun sha256(key: String): String = raw(key).let { v -> Checks.sha256(v, at(key), fail) }
    fun name(key: String): String = raw(key).let { v -> Checks.name(v, at(key), fail) }
    fun literal(key: String, allowed: Collection<String>): String = raw(key).let { v -> Checks.literal(v, at(key), allowed, fail) }
    fun anyValue(key: String): Any = raw(key)
}

/** The constrained field types of hydra_edge.records.fields, one function each. */
object Checks {
    const val LARGE = 1e12 // the largest magnitude any measured or configured number may have
    const val MAX_HEADS = 128L
    // Python's pattern ends in \Z: a final newline is refused. java.util.regex, not kotlin.text.Regex, whose
    // lambdas dx turns into invoke-custom (Android cannot run those)
    val SHA256: java.util.regex.Pattern = java.util.regex.Pattern.compile("[0-9a-f]{64}")

    private fun kind(v: Any): String = when (v) {
        is String -> "str"; is Boolean -> "bool"; is Long, is Int, is BigInteger -> "int"; is Double -> "float"
        is JSONObject -> "object"; is JSONArray -> "array"; else -> if (v == JSONObject.NULL) "null" else "unknown"
    }

    fun string(v: Any, at: String, fail: (String, String) -> Nothing): String =
        v as? String ?: fail(at, "expected `str`, got `${kind(v)}`")

    fun bool(v: Any, at: String, fail: (String, String) -> Nothing): Boolean =
        v as? Boolean ?: fail(at, "expected `bool`, got `${kind(v)}`")

    fun long(v: Any, at: String, lo: Long, hi: Long, fail: (String, String) -> Nothing): Long {
        val n = when (v) {
            is Long -> v
            is Int -> v.toLong()
            is BigInteger -> fail(at, "expected `int` in range")
            else -> fail(at, "expected `int`, got `${kind(v)}`")
        }
        if (n < lo) fail(at, "expected `int` >= $lo")
        if (n > hi) fail(at, "expected `int` <= $hi")
        return n
    }

    /** A float field: JSON ints are taken (msgspec converts them), bools are not; bounds inclusive unless [loOpen]. */
    fun double(v: Any, at: String, lo: Double, hi: Double, loOpen: Boolean, fail: (String, String) -> Nothing): Double {
        val d = when (v) {
            is Double -> v
            is Long -> v.toDouble()
            is Int -> v.toDouble()
            is BigInteger -> v.toDouble()
            else -> fail(at, "expected `float`, got `${kind(v)}`")
        }
        if (d.isNaN() || (loOpen && d <= lo) || (!loOpen && d < lo)) fail(at, "expected `float` ${if (loOpen) ">" else ">="} ${Py.repr(lo)}")
        if (d > hi) fail(at, "expected `float` <= ${Py.repr(hi)}")
        return d
    }

    fun array(v: Any, at: String, fail: (String, String) -> Nothing): JSONArray =
        v as? JSONArray ?: fail(at, "expected `array`, got `${kind(v)}`")

    fun obj(v: Any, at: String, fail: (String, String) -> Nothing): JSONObject =
        v as? JSONObject ?: fail(at, "expected `object`, got `${kind(v)}`")

    fun sha256(v: Any, at: String, fail: (String, String) -> Nothing): String {
        val s = string(v, at, fail)
        if (!SHA256.matcher(s).matches()) fail(at, "expected `str` matching regex '^[0-9a-f]{64}$'")
        return s
    }

    /** A name: 1 to 4096 characters (code points, as Python counts them). */
    fun name(v: Any, at: String, fail: (String, String) -> Nothing): String {
        val s = string(v, at, fail)
        val n = s.codePointCount(0, s.length)
        if (n < 1) fail(at, "expected `str` of length >= 1")
        if (n > 4096) fail(at, "expected `str` of length <= 4096")
        return s
    }

    fun literal(v: Any, at: String, allowed: Collection<String>, fail: (String, String) -> Nothing): String {
        val s = string(v, at, fail)
        if (s !in allowed) fail(at, "invalid enum value '$s'")
        return s
    }

    /** hydra_edge.records.fields.relative_path: a file inside its bundle (relative, no `..`, no NUL or backslash). */
    fun relativePath(value: String, at: String, fail: (String, String) -> Nothing) {
        if (value.isEmpty() || value.contains('\u0000') || value.contains('\\')) fail(at, "'$value' is not a file name")
        if (value.startsWith("/") || ("/$value/").contains("/../") || value.startsWith("~"))
            fail(at, "'$value' leaves the bundle; a record names files relative to its bundle")
    }

    /** Python's `values == sorted(set(values))` for finite floats: strictly rising (-0.0 equals 0.0 there too). */
    fun rising(values: List<Double>): Boolean = (0 until values.size - 1).all { values[it].toDouble() < values[it + 1].toDouble() }

    fun <T> list(a: JSONArray, at: String, maxLength: Int = Int.MAX_VALUE, minLength: Int = 0,
                 fail: (String, String) -> Nothing, item: (Any, String) -> T): List<T> {
        if (a.length() < minLength) fail(at, "expected `array` of length >= $minLength")
        if (a.length() > maxLength) fail(at, "expected `array` of length <= $maxLength")
        return (0 until a.length()).map { item(a.get(it), "$at[$it]") }
    }
}
