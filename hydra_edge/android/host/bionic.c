/*
 * What Android's C library (bionic) gives the APK's x86_64 native libraries and glibc does not, so the
 * libraries the phone runs load unchanged on an x86_64 Linux host (hydra_edge/android/host_runtime.py).
 *
 * Two kinds of symbol:
 *   - bionic-only names the libraries import (__errno, __sF, the liblog calls, the _FORTIFY checks, ...);
 *   - hx_<name>: a glibc function whose meaning differs from bionic's (numbering, type sizes, long double's
 *     format, FILE pointers into __sF). host_runtime.py renames those imports in the libraries' link tables
 *     (patchelf --rename-dynamic-symbols NAME hx_NAME), so each call lands here and is translated.
 * The runtime's log lines go to stderr, which host_runtime.py keeps in a log file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

int __xpg_strerror_r(int errnum, char *buf, size_t len);

/* ---- bionic-only symbols ---- */

int *__errno(void) { return __errno_location(); }

/* bionic's FILE is 152 bytes on LP64; stdin, stdout and stderr were &__sF[0], [1], [2] in older NDK headers. */
enum { BIONIC_FILE_BYTES = 152 };
char __sF[3 * BIONIC_FILE_BYTES] __attribute__((aligned(16)));

static FILE *host_file(FILE *f) {
    const char *p = (const char *)f;
    if (p < __sF || p >= __sF + sizeof __sF) return f;
    switch ((p - __sF) / BIONIC_FILE_BYTES) {
        case 0: return stdin;
        case 1: return stdout;
        default: return stderr;
    }
}

/* No system properties on the host: every one reads as unset, which is what the libraries expect off-device. */
int __system_property_get(const char *name, char *value) {
    (void)name;
    if (value) value[0] = '\0';
    return 0;
}

void android_set_abort_message(const char *msg) { fprintf(stderr, "abort message: %s\n", msg ? msg : ""); }

int __android_log_write(int priority, const char *tag, const char *text) {
    static const char letters[] = "??VDIWEFS";
    char level = priority >= 0 && priority < (int)sizeof letters - 1 ? letters[priority] : '?';
    return fprintf(stderr, "%c/%s: %s\n", level, tag ? tag : "", text ? text : "");
}

int __android_log_vprint(int priority, const char *tag, const char *fmt, va_list ap) {
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    return __android_log_write(priority, tag, line);
}

int __android_log_print(int priority, const char *tag, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = __android_log_vprint(priority, tag, fmt, ap);
    va_end(ap);
    return n;
}

void __android_log_assert(const char *cond, const char *tag, const char *fmt, ...) {
    fprintf(stderr, "F/%s: assertion %s: ", tag ? tag : "", cond ? cond : "");
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    abort();
}

void __assert2(const char *file, int line, const char *function, const char *expression) {
    fprintf(stderr, "F/libc: %s:%d: %s: assertion \"%s\" failed\n", file, line, function, expression);
    abort();
}

char *__gnu_strerror_r(int errnum, char *buf, size_t len) { return strerror_r(errnum, buf, len); }

/* _FORTIFY_SOURCE checks bionic's headers compile in: the same checks, ending as bionic ends them. */
size_t __strlen_chk(const char *s, size_t bound) {
    size_t n = strlen(s);
    if (n >= bound) {
        fputs("F/libc: strlen: prevented read past end of buffer\n", stderr);
        abort();
    }
    return n;
}

char *__strchr_chk(const char *s, int c, size_t bound) { (void)bound; return strchr(s, c); }

char *__strrchr_chk(const char *s, int c, size_t bound) { (void)bound; return strrchr(s, c); }

ssize_t __write_chk(int fd, const void *buf, size_t count, size_t bound) {
    if (count > bound) {
        fputs("F/libc: write: prevented read past end of buffer\n", stderr);
        abort();
    }
    return write(fd, buf, count);
}

/* ---- hx_*: imports renamed in the link tables because bionic means something else by them ---- */

/* sysconf: bionic numbers its names differently (bionic's unistd.h / sysconf.h). */
long hx_sysconf(int bionic_name) {
    static const struct { int bionic, glibc; } names[] = {
        {0x00, _SC_ARG_MAX}, {0x06, _SC_CLK_TCK}, {0x0b, _SC_OPEN_MAX}, {0x27, _SC_PAGESIZE},
        {0x28, _SC_PAGESIZE}, {0x60, _SC_NPROCESSORS_CONF}, {0x61, _SC_NPROCESSORS_ONLN},
        {0x62, _SC_PHYS_PAGES}, {0x63, _SC_AVPHYS_PAGES}, {0x8f, _SC_LEVEL1_ICACHE_SIZE},
        {0x90, _SC_LEVEL1_ICACHE_ASSOC}, {0x91, _SC_LEVEL1_ICACHE_LINESIZE}, {0x92, _SC_LEVEL1_DCACHE_SIZE},
        {0x93, _SC_LEVEL1_DCACHE_ASSOC}, {0x94, _SC_LEVEL1_DCACHE_LINESIZE}, {0x95, _SC_LEVEL2_CACHE_SIZE},
        {0x96, _SC_LEVEL2_CACHE_ASSOC}, {0x97, _SC_LEVEL2_CACHE_LINESIZE},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].bionic == bionic_name) return sysconf(names[i].glibc);
    }
    fprintf(stderr, "W/host: sysconf(0x%x): a bionic name this host shim does not map\n", bionic_name);
    errno = EINVAL;
    return -1;
}

/* bionic's LP64 sigset_t is 8 bytes; glibc's sigfillset would write 128 into it. */
int hx_sigfillset(void *set) {
    memset(set, 0xff, 8);
    return 0;
}

/* bionic's strerror_r is POSIX's (returns int, fills buf); glibc's plain name is the GNU one. */
int hx_strerror_r(int errnum, char *buf, size_t len) { return __xpg_strerror_r(errnum, buf, len); }

/* stdio: a FILE pointer may be bionic's &__sF[i]. */
int hx_vfprintf(FILE *f, const char *fmt, va_list ap) { return vfprintf(host_file(f), fmt, ap); }
int hx_fprintf(FILE *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(host_file(f), fmt, ap);
    va_end(ap);
    return n;
}
int hx_fputs(const char *s, FILE *f) { return fputs(s, host_file(f)); }
int hx_fputc(int c, FILE *f) { return fputc(c, host_file(f)); }
int hx_fflush(FILE *f) { return fflush(f ? host_file(f) : NULL); }
size_t hx_fwrite(const void *p, size_t size, size_t n, FILE *f) { return fwrite(p, size, n, host_file(f)); }
size_t hx_fread(void *p, size_t size, size_t n, FILE *f) { return fread(p, size, n, host_file(f)); }
int hx_ferror(FILE *f) { return ferror(host_file(f)); }
int hx_fclose(FILE *f) { return fclose(host_file(f)); }
int hx_fseek(FILE *f, long offset, int whence) { return fseek(host_file(f), offset, whence); }
int hx_fseeko(FILE *f, off_t offset, int whence) { return fseeko(host_file(f), offset, whence); }
off_t hx_ftello(FILE *f) { return ftello(host_file(f)); }
int hx_getc(FILE *f) { return getc(host_file(f)); }
int hx_ungetc(int c, FILE *f) { return ungetc(c, host_file(f)); }
wint_t hx_getwc(FILE *f) { return getwc(host_file(f)); }
wint_t hx_ungetwc(wint_t c, FILE *f) { return ungetwc(c, host_file(f)); }
wint_t hx_fputwc(wchar_t c, FILE *f) { return fputwc(c, host_file(f)); }

/* long double is IEEE binary128 on Android x86_64 and the x87 80-bit format on glibc. */
typedef _Float128 quad;
quad hx_strtold(const char *s, char **end) { return (quad)strtold(s, end); }
quad hx_strtold_l(const char *s, char **end, locale_t loc) { return (quad)strtold_l(s, end, loc); }
quad hx_wcstold(const wchar_t *s, wchar_t **end) { return (quad)wcstold(s, end); }
quad hx_frexpl(quad x, int *exp) { return (quad)frexpl((long double)x, exp); }
quad hx_ldexpl(quad x, int exp) { return (quad)ldexpl((long double)x, exp); }
