package org.hydraedge.core

import java.math.BigDecimal
import java.math.MathContext
import java.math.RoundingMode

/**
 * Python's float formatting (`{:.0f}`, `{:.3g}`, `{:g}`), so a switch's reason reads the same on a
 * phone as on a board: the parity test compares the reasons text for text.
 *
 * Why not String.format: Java rounds the decimal expansion half-up ("%.0f" of 2.5 is "3"), Python
 * rounds the exact binary value half-even ("2"), and "%g" keeps trailing zeros. BigDecimal(double)
 * is the exact binary value, so rounding it HALF_EVEN is what Python does.
 */
object Py {
    /** `format(x, ".{digits}f")`. */
    fun f(x: Double, digits: Int): String {
        special(x)?.let { return it }
        val s = BigDecimal(x).setScale(digits, RoundingMode.HALF_EVEN).toPlainString()
        return if (x < 0 || (x == 0.0 && 1.0 / x < 0)) (if (s.startsWith("-")) s else "-$s") else s
    }

    /** `format(x, ".{precision}g")`; `format(x, "g")` is precision 6. */
    fun g(x: Double, precision: Int = 6): String {
        special(x)?.let { return it }
        val p = if (precision == 0) 1 else precision
        if (x == 0.0) return if (1.0 / x < 0) "-0" else "0"
        val rounded = BigDecimal(x).round(MathContext(p, RoundingMode.HALF_EVEN))
        val exp = rounded.precision() - rounded.scale() - 1 // decimal exponent of the leading digit
        return if (exp < -4 || exp >= p) {
            val digits = rounded.unscaledValue().abs().toString().padEnd(p, '0').trimEnd('0')
            val mantissa = if (digits.length > 1) digits[0] + "." + digits.substring(1) else digits
            val sign = if (rounded.signum() < 0) "-" else ""
            sign + mantissa + "e" + (if (exp < 0) "-" else "+") + Math.abs(exp).toString().padStart(2, '0')
        } else {
            var s = rounded.setScale(Math.max(p - 1 - exp, 0), RoundingMode.HALF_EVEN).toPlainString()
            if (s.contains('.')) s = s.trimEnd('0').trimEnd('.')
            s
        }
    }

    /** Near enough to Python's repr for messages (never compared): integral values keep ".0". */
    fun repr(x: Double): String {
        special(x)?.let { return it }
        return if (x == Math.rint(x) && Math.abs(x) < 1e16) BigDecimal(x).toPlainString() + ".0" else x.toString()
    }

    private fun special(x: Double): String? = when {
        x.isNaN() -> "nan"
        x == Double.POSITIVE_INFINITY -> "inf"
        x == Double.NEGATIVE_INFINITY -> "-inf"
        else -> null
    }
}
