package org.hydraedge.core

import org.json.JSONObject
import java.io.File

/**
 * One JSON line per file for the command-line readers the parity tests ask ([LutCheck], [ManifestCheck]):
 * whether [read] refused it, and at which field. Only a refusal of kind [E] is a verdict; anything else the
 * reader throws ends the run with its trace, which the tests take as a defect of the reader. Inline, so the
 * lambda is no class of its own (an APK's DEX may hold no invoke-custom).
 */
inline fun <reified E : RecordException> printVerdicts(files: List<String>, read: (File) -> Unit) {
    val out = StringBuilder()
    for (name in files) {
        val line = JSONObject()
        try {
            read(File(name))
            line.put("refused", false)
        } catch (e: RecordException) {
            if (e !is E) throw e
            line.put("refused", true).put("path", e.path ?: JSONObject.NULL).put("message", e.message)
        }
        out.append(line).append('\n')
    }
    System.out.write(out.toString().toByteArray(Charsets.UTF_8)) // UTF-8 whatever the locale
    System.out.flush()
}
