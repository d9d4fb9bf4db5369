package org.hydraedge.core

import org.json.JSONObject
import java.io.File

/**
 * Reads each lut.json given and prints one JSON line per file: whether [Lut.decode] refused it and
 * at which field. The parity test feeds it the same mutated tables as Python's reader and compares.
 */
object LutCheck {
    @JvmStatic
    fun main(args: Array<String>) {
        val out = StringBuilder()
        for (name in args) {
            val line = JSONObject()
            try {
                Lut.decode(File(name).readBytes(), "lut.json")
                line.put("refused", false)
            } catch (e: LutException) {
                line.put("refused", true).put("path", e.path ?: JSONObject.NULL).put("message", e.message)
            }
            out.append(line).append('\n')
        }
        print(out)
    }
}
