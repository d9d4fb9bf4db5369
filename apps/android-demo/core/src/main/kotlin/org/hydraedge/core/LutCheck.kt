package org.hydraedge.core

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
        printVerdicts<LutException>(if (bundle != null) args.drop(2) else args.toList()) {
            if (bundle != null) Lut.read(it, bundle) else Lut.decode(it.readBytes(), "lut.json")
        }
    }
}
