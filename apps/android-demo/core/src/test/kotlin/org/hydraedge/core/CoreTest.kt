package org.hydraedge.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.io.File

/**
 * The library on its own (the parity test proves it equal to Python; these pin what holds whatever
 * Python does): Python's number formatting, strict JSON, the correction's atomic round trip and refusals.
 */
class CoreTest {
    @Test
    fun `python formatting rounds half even on the exact binary value`() {
        assertEquals("2", Py.f(2.5, 0))
        assertEquals("4", Py.f(3.5, 0))
        assertEquals("-0", Py.f(-0.4, 0))
        assertEquals("1.50", Py.f(1.5, 2))
        assertEquals("37.5", Py.g(37.5, 3))
        assertEquals("20.5", Py.g(20.5, 3))
        assertEquals("1e+05", Py.g(1e5, 3))
        assertEquals("6e+06", Py.g(6e6))
        assertEquals("60000", Py.g(60000.0, 6))
        assertEquals("0.0001", Py.g(1e-4, 3))
        assertEquals("1e-05", Py.g(1e-5, 3))
        assertEquals("3", Py.g(3.0))
    }

    @Test
    fun `json is read as strictly as msgspec reads it`() {
        for (bad in listOf("{\"a\":1,}", "{'a':1}", "{a:1}", "[1,,2]", "{\"a\":NaN}", "01", "1.", "\"\u0001\"", "{\"a\":1} x", "1e400",
                "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\ud800x\"", "[".repeat(513) + "]".repeat(513)))
            assertThrows(StrictJson.SyntaxError::class.java, { StrictJson.parse(bad) }, bad)
        assertEquals("\ud800\udc00", StrictJson.parse("\"\\ud800\\udc00\""))
        StrictJson.parse("[".repeat(512) + "]".repeat(512))
        val o = StrictJson.parse("{\"a\": 2.5, \"b\": [true, null, \"x\\u00e9\"]}") as org.json.JSONObject
        assertEquals(2.5, o.get("a"))
        assertEquals(1L, (StrictJson.parse("1") as Long))
        assertEquals("xé", o.getJSONArray("b").getString(2))
        val nan = assertThrows(StrictJson.SyntaxError::class.java) { StrictJson.parse("{\"a\": {\"b\": [1, NaN]}}") }
        assertEquals("$.a.b[1]", nan.path)
        // a repeated key is refused at its second occurrence, once the whole text parses (Python's order)
        val twice = assertThrows(StrictJson.SyntaxError::class.java) { StrictJson.parse("{\"a\": {\"b\": 1, \"b\": 2}, \"a\": 3}") }
        assertEquals("$.a.b", twice.path)
        assertEquals(null, assertThrows(StrictJson.SyntaxError::class.java) { StrictJson.parse("{\"a\": 1, \"a\": 2} x") }.path)
        // the last non-finite number in the document is named, a number too large for a double too
        assertEquals("$.b", assertThrows(StrictJson.SyntaxError::class.java) { StrictJson.parse("{\"a\": NaN, \"b\": -1e400}") }.path)
    }

    @Test
    fun `a wall clock before 1970 or no number restores and saves nothing, one warning`(@TempDir dir: File) {
        val table = Table(listOf(3, 12).map { Candidate(it, "h$it", "h$it.pte", "a".repeat(64), "executorch", 1, it.toDouble(), 0.9, null) },
            listOf(intArrayOf(1)), "android", DoubleArray(0), 0.0, null, DoubleArray(0), 0.0, 0.0, "a".repeat(64), sha256 = "b".repeat(64))
        val lut = File(dir, "lut.json")
        val saved = Correction.encode(correction(), "c")
        Correction.writeAtomically(Correction.pathFor(lut), saved)
        for (bad in listOf(-1.0, -3.15e7, Double.NaN, Double.POSITIVE_INFINITY)) {
            var wall = bad
            val warnings = ArrayList<String>()
            val loop = LatencyLoop(lut, table, LoopSettings(budgetMs = 10.0), { wall }, Logger { level, m -> if (level == "WARNING") warnings.add(m) })
            assertTrue(loop.governor.learned.isEmpty(), "restored at $bad") // its age cannot be known
            var t = 0.0
            while (loop.governor.revision == 0 && t < 120) { loop.governor.observe(12, 24.0, t); loop.governor.step(12, 12, 10.0, t); t += 0.1 }
            assertTrue(loop.governor.revision > 0, "nothing learned to save")
            assertNull(loop.snapshot())
            assertNull(loop.snapshot())
            assertEquals(1, warnings.size, warnings.toString())
            assertTrue(warnings[0].contains("1970") && !warnings[0].contains("\n"), warnings[0])
            assertTrue(saved.contentEquals(Correction.pathFor(lut).readBytes()))
            wall = 1.75e9 // the clock set: what was learned is saved
            assertTrue(loop.snapshot() != null)
        }
    }

    private fun correction(saved: Double = 1.75e9) = CorrectionDocument("test", saved, "a".repeat(64), "b".repeat(64), 41.0,
        listOf(LearnedLatency(12, 60.0, 1.5, 50)))

    @Test
    fun `a correction is written atomically and reads back`(@TempDir dir: File) {
        val file = File(dir, "lut.correction.json")
        Correction.writeAtomically(file, Correction.encode(correction(), file.path))
        assertEquals(correction(), Correction.read(file))
        assertEquals(listOf("lut.correction.json"), dir.list()!!.toList()) // no temporary file left behind
        assertEquals(File(dir, "lut.correction.json").absolutePath, Correction.pathFor(File(dir, "lut.json")).absolutePath)
    }

    @Test
    fun `a damaged or out of range correction is refused naming its field`(@TempDir dir: File) {
        val good = String(Correction.encode(correction(), "c"))
        for ((text, path) in listOf(good.replace("\"p90_ms\": 60.0", "\"p90_ms\": -1.0") to "$.learned[0].p90_ms",
                good.replace("\"heads\": 12", "\"heads\": 0") to "$.learned[0].heads",
                good.replace("latency-correction", "lut") to "$.schema",
                good.replace("\"budget_ms\": 41.0", "\"budget_ms\": 0") to "$.budget_ms",
                good.substring(0, good.length / 2) to "$")) {
            val e = assertThrows(CorrectionException::class.java) { Correction.decode(text.toByteArray(), "c") }
            assertEquals(path, e.path, text)
        }
        assertThrows(CorrectionException::class.java) { Correction.encode(correction(Double.NaN), "c") }
        val folder = File(dir, "lut.correction.json").apply { mkdir() }
        assertThrows(CorrectionException::class.java) { Correction.read(folder) }
    }

    @Test
    fun `an out of range thermal status or battery level is no reading`() {
        assertNull(AndroidReading(-1, Double.NaN, 50, 2).validThermalStatus)
        assertNull(AndroidReading(7, Double.NaN, 50, 2).validThermalStatus)
        assertEquals(6, AndroidReading(6, Double.NaN, 50, 2).validThermalStatus)
        assertNull(AndroidReading(0, Double.NaN, Int.MIN_VALUE, 2).validBatteryLevel)
        assertTrue(AndroidReading(0, Double.NaN, 50, 2).charging)
        assertFalse(AndroidReading(0, Double.NaN, 100, 5).charging) // FULL is not charging, as dumpsys reads it
    }

    @Test
    fun `the raise gate waits out raise_after_s and a held reading starts it over`() {
        val gate = RaiseGate(10.0)
        assertEquals(0, gate.gate(0, 3, 0.0))
        assertEquals(0, gate.gate(0, 2, 5.0))
        assertEquals(2, gate.gate(0, 3, 10.0)) // the least asked for while it waited
        assertEquals(0, gate.gate(0, 3, 11.0, fresh = false))
        assertEquals(1, gate.gate(3, 1, 12.0)) // down at once
    }

    private fun threeHeadCounts(): Table {
        val c = listOf(3, 6, 12).map { Candidate(it, "h$it", "h$it.pte", "a".repeat(64), "executorch", 1, it.toDouble(), 0.9, null) }
        // one battery band (charging) x one thermal band: the table always asks for 12 heads
        return Table(c, listOf(intArrayOf(2), intArrayOf(2)), "android", DoubleArray(0), 0.0, null, doubleArrayOf(0.0), 0.0,
            0.0, "b".repeat(64))
    }

    @Test
    fun `naming the thermal headroom keeps every other setting`() {
        val settings = SignalSettings(staleAfterS = 12.0, raiseAfterS = 3.0, assumedHot = 2.0, namesHeadroom = true)
        assertEquals(SignalSettings(12.0, 3.0, 2.0, false), settings.namingHeadroom(false))
        assertEquals(settings, settings.namingHeadroom(false).namingHeadroom(true))
        // settings that fail the checks are refused however they are made
        assertThrows(IllegalArgumentException::class.java) { settings.copy(staleAfterS = 0.0) }
    }

    @Test
    fun `a head count that will not load falls back to the fewest and is never chosen again`() {
        var now = 0.0
        val sw = Switcher(threeHeadCounts(), SignalSettings(raiseAfterS = 0.0), { now })
        val phone = AndroidReading(0, Double.NaN, 80, 2)
        assertEquals(12, sw.poll(phone))
        assertTrue(sw.loadFailed(12, "rebuild refused"))
        assertEquals(3, sw.heads)
        assertEquals("load failed: rebuild refused", sw.reasons(1).single())
        now = 100.0
        assertEquals(6, sw.poll(phone)) // the largest that has not failed
        assertEquals("state", sw.reasons(1).single())
        now = 200.0
        assertTrue(sw.loadFailed(6, "no memory"))
        assertEquals(3, sw.poll(phone))
        assertFalse(sw.loadFailed(3, "no memory")) // nothing fewer: the app stops
    }
}
