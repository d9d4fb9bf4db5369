package org.hydraedge.core

import org.json.JSONObject
import java.io.File

/**
 * `ManifestCheck <manifest.json>...`: reads each manifest as [Manifest.decode] does and prints one JSON line
 * per file: whether it was refused and at which field. The readers' parity test compares it with Python's
 * reader on the fields the phone reads; any exception but a [BundleException] ends it with a trace.
 */
object ManifestCheck {
    @JvmStatic
    fun main(args: Array<String>) {
        val out = StringBuilder()
        for (name in args) {
            val line = JSONObject()
            try {
                Manifest.decode(File(name).readBytes(), "manifest.json")
                line.put("refused", false)
            } catch (e: BundleException) {
                line.put("refused", true).put("path", e.path ?: JSONObject.NULL).put("message", e.message)
            }
            out.append(line).append('\n')
        }
        System.out.write(out.toString().toByteArray(Charsets.UTF_8)) // UTF-8 whatever the locale
        System.out.flush()
    }
}
