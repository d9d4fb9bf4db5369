package org.hydraedge.core

import org.json.JSONObject
import java.io.File

/**
 * `LutCheck [--bundle <folder>] <lut.json>...`: reads each table given and prints one JSON line per file:
 * whether the reader refused it and at which field. Without --bundle that is [Lut.decode] (the record
 * alone), with it [Lut.read] against that bundle, as the app reads it. The parity tests feed it the same
 * mutated tables as Python's reader and compare; any exception but a [LutException] ends it with a trace.
 */
object LutCheck {
    @JvmStatic
    fun main(args: Array<String>) {
        val bundle = if (args.firstOrNull() == "--bundle") File(args[1]) else null
        val out = StringBuilder()
        for (name in if (bundle != null) args.drop(2) else args.toList()) {
            val line = JSONObject()
            try {
                if (bundle != null) Lut.read(File(name), bundle) else Lut.decode(File(name).readBytes(), "lut.json")
                line.put("refused", false)
            } catch (e: LutException) {
                line.put("refused", true).put("path", e.path ?: JSONObject.NULL).put("message", e.message)
            }
            out.append(line).append('\n')
        }
        System.out.write(out.toString().toByteArray(Charsets.UTF_8)) // UTF-8 whatever the locale
        System.out.flush()
    }
}
