package org.hydraedge.core

/**
 * `ManifestCheck <manifest.json>...`: reads each manifest as [Manifest.decode] does and prints one JSON line
 * per file: whether it was refused and at which field. The readers' parity test compares it with Python's
 * reader on the fields the phone reads; any exception but a [BundleException] ends it with a trace.
 */
object ManifestCheck {
    @JvmStatic
    fun main(args: Array<String>) =
        printVerdicts<BundleException>(args.toList()) { Manifest.decode(it.readBytes(), "manifest.json") }
}
