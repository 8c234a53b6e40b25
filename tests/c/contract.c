/*
 * contract.c -- checks the hccn C ABI (v1) against its contract, API.md, and nothing else.
 *
 * Run as `hccnrun -n N ./contract` (1 <= N <= 8). Every rank calls hccn_init_from_env, then runs
 * every collective with exact expected values (Gloo-style: element j of rank r is a formula of j
 * and r, small enough that every data type holds it exactly), the in-place forms, every root, bad
 * input, streams and events, sub-communicators and hccn_comm_init_rank.
 *
 * Every comparison is exact except AVG of the floating types, where the true quotient need not be
 * representable: that one allows (N+2) units of rounding of the largest term.
 *
 * Output: one line per failed check, `FAIL rank R: <what> (dtype, op, count, root)`; rank 0 ends
 * with `contract: N checks passed`. Exit status 1 when a check failed on this rank.
 *
 * Environment (optional): CONTRACT_TIMEOUT=seconds for the watchdog (default 200),
 * CONTRACT_VERBOSE=1 prints each section on rank 0.
 *
 * Build: gcc -std=c99 -Wall -Wextra -Werror -fsanitize=address,undefined -Iinclude \
 *            tests/c/contract.c -Ltarget/release -lhccn -Wl,-rpath,$PWD/target/release -o contract
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hccn.h"

typedef unsigned long long ull;

#define MAX_RANKS 8       /* the value formulas below stay exact in INT8 up to 8 ranks */
#define GUARD 64          /* bytes after every receive buffer that no call may touch */
#define GARBAGE 0x7F      /* fill byte of receive buffers: never a valid expected value */
#define NO_OP (-1)
#define NO_ROOT (-1L)

/* ------------------------------------------------------------------------------------------ */
/* Bookkeeping: the check macro, failure lines, the watchdog                                   */
/* ------------------------------------------------------------------------------------------ */

static hccn_comm *g_world;
static uint32_t g_rank, g_size;
static ull g_pass, g_fail;
static unsigned g_timeout = 200;
static int g_verbose;
static char g_alarm_msg[256];
static size_t g_alarm_len;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int check_(int ok, const char *fmt, ...)
{
    va_list ap;
    if (ok) {
        g_pass++;
        return 1;
    }
    g_fail++;
    printf("FAIL rank %u: ", (unsigned)g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return 0;
}

/* CHECK(condition, printf-style description): counts a pass or prints one FAIL line. */
#define CHECK(cond, ...) check_((cond) ? 1 : 0, __VA_ARGS__)

static void on_alarm(int sig)
{
    ssize_t w;
    (void)sig;
    w = write(STDOUT_FILENO, g_alarm_msg, g_alarm_len);
    (void)w;
    _exit(3);
}

/* Names the part being run, so that a hang is reported with its place by the watchdog. */
static void section(const char *name)
{
    int len = snprintf(g_alarm_msg, sizeof g_alarm_msg,
                       "FAIL rank %u: watchdog: no progress for %u s in section '%s'\n",
                       (unsigned)g_rank, g_timeout, name);
    g_alarm_len = len < 0 ? 0 : ((size_t)len < sizeof g_alarm_msg ? (size_t)len : sizeof g_alarm_msg - 1);
    alarm(g_timeout);
    if (g_verbose && g_rank == 0) {
        printf("[contract] %s\n", name);
        fflush(stdout);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        printf("FAIL rank %u: out of memory (%llu bytes)\n", (unsigned)g_rank, (ull)bytes);
        exit(2);
    }
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Names                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static const hccn_datatype ALL_DT[] = {HCCN_INT8,   HCCN_INT16, HCCN_INT32,  HCCN_FP16,
                                       HCCN_FP32,   HCCN_INT64, HCCN_UINT64, HCCN_UINT8,
                                       HCCN_UINT16, HCCN_UINT32, HCCN_FP64,  HCCN_BF16};
static const hccn_reduce_op ALL_OP[] = {HCCN_SUM, HCCN_PROD, HCCN_MAX, HCCN_MIN, HCCN_AVG};
static const uint64_t COUNTS[] = {0, 1, 7, 1023};
#define N_DT (sizeof ALL_DT / sizeof ALL_DT[0])
#define N_OP (sizeof ALL_OP / sizeof ALL_OP[0])
#define N_COUNTS (sizeof COUNTS / sizeof COUNTS[0])

static const char *dt_name(hccn_datatype dt)
{
    switch ((int)dt) {
    case HCCN_INT8: return "INT8";
    case HCCN_INT16: return "INT16";
    case HCCN_INT32: return "INT32";
    case HCCN_FP16: return "FP16";
    case HCCN_FP32: return "FP32";
    case HCCN_INT64: return "INT64";
    case HCCN_UINT64: return "UINT64";
    case HCCN_UINT8: return "UINT8";
    case HCCN_UINT16: return "UINT16";
    case HCCN_UINT32: return "UINT32";
    case HCCN_FP64: return "FP64";
    case HCCN_BF16: return "BF16";
    default: return "dtype?";
    }
}

static const char *op_name(int op)
{
    switch (op) {
    case HCCN_SUM: return "SUM";
    case HCCN_PROD: return "PROD";
    case HCCN_MAX: return "MAX";
    case HCCN_MIN: return "MIN";
    case HCCN_AVG: return "AVG";
    default: return "-";
    }
}

static const char *rc_name(hccn_result rc)
{
    switch ((int)rc) {
    case HCCN_SUCCESS: return "HCCN_SUCCESS";
    case HCCN_ERROR_INVALID_ARGUMENT: return "HCCN_ERROR_INVALID_ARGUMENT";
    case HCCN_ERROR_NULL_POINTER: return "HCCN_ERROR_NULL_POINTER";
    case HCCN_ERROR_OUT_OF_MEMORY: return "HCCN_ERROR_OUT_OF_MEMORY";
    case HCCN_ERROR_INTERNAL: return "HCCN_ERROR_INTERNAL";
    case HCCN_ERROR_NOT_SUPPORTED: return "HCCN_ERROR_NOT_SUPPORTED";
    case HCCN_ERROR_NOT_FOUND: return "HCCN_ERROR_NOT_FOUND";
    case HCCN_ERROR_UNAVAILABLE: return "HCCN_ERROR_UNAVAILABLE";
    case HCCN_ERROR_SYSTEM: return "HCCN_ERROR_SYSTEM";
    case HCCN_ERROR_TIMEOUT: return "HCCN_ERROR_TIMEOUT";
    case HCCN_ERROR_CONNECT: return "HCCN_ERROR_CONNECT";
    case HCCN_ERROR_TRANSFER: return "HCCN_ERROR_TRANSFER";
    case HCCN_ERROR_BACKEND: return "HCCN_ERROR_BACKEND";
    case HCCN_ERROR_REMOTE: return "HCCN_ERROR_REMOTE";
    case HCCN_ERROR_RANK_FAILED: return "HCCN_ERROR_RANK_FAILED";
    case HCCN_ERROR_REVOKED: return "HCCN_ERROR_REVOKED";
    case HCCN_ERROR_ABORTED: return "HCCN_ERROR_ABORTED";
    case HCCN_IN_PROGRESS: return "HCCN_IN_PROGRESS";
    case HCCN_ERROR_AUTH: return "HCCN_ERROR_AUTH";
    case HCCN_ERROR_STORE: return "HCCN_ERROR_STORE";
    case HCCN_ERROR_STALE_EPOCH: return "HCCN_ERROR_STALE_EPOCH";
    default: return "unknown result";
    }
}

/* "(FP32, SUM, count=7, root=2)" */
static void mkctx(char *out, size_t cap, hccn_datatype dt, int op, uint64_t count, long root)
{
    char rootbuf[24];
    if (root < 0)
        snprintf(rootbuf, sizeof rootbuf, "-");
    else
        snprintf(rootbuf, sizeof rootbuf, "%ld", root);
    snprintf(out, cap, "(%s, %s, count=%llu, root=%s)", dt_name(dt), op_name(op), (ull)count, rootbuf);
}

/* Checks a result code; on an unexpected one prints it with hccn_get_last_error(). */
static int check_rc(hccn_result got, hccn_result want, const char *what, const char *ctx)
{
    return CHECK(got == want, "%s returned %s (%d), expected %s; last error: \"%s\" %s", what,
                 rc_name(got), (int)got, rc_name(want), got == HCCN_SUCCESS ? "" : hccn_get_last_error(),
                 ctx);
}

#define ANY_ERROR (-1)

/* A call that must fail: the code (or any error), then the thread-local message and the static
 * string for that code. */
static void expect_fail(hccn_result got, int want, const char *what)
{
    const char *msg, *str;
    if (want == ANY_ERROR)
        CHECK(got != HCCN_SUCCESS && got != HCCN_IN_PROGRESS,
              "bad input: %s returned %s (%d), expected an error", what, rc_name(got), (int)got);
    else
        CHECK(got == (hccn_result)want, "bad input: %s returned %s (%d), expected %s", what, rc_name(got),
              (int)got, rc_name((hccn_result)want));
    if (got == HCCN_SUCCESS)
        return;
    msg = hccn_get_last_error();
    CHECK(msg != NULL && msg[0] != '\0',
          "bad input: after %s failed, hccn_get_last_error() is %s", what, msg ? "\"\"" : "NULL");
    str = hccn_get_error_string(got);
    CHECK(str != NULL && str[0] != '\0', "bad input: hccn_get_error_string(%d) after %s is %s", (int)got,
          what, str ? "\"\"" : "NULL");
}

/* ------------------------------------------------------------------------------------------ */
/* Element access for all 12 types (FP16 / BF16 through float bit patterns)                    */
/* ------------------------------------------------------------------------------------------ */

static uint16_t f2h(float f)
{
    uint32_t x, sign, mant, hm, rem;
    int32_t exp;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    mant = x & 0x7fffffu;
    if (((x >> 23) & 0xffu) == 0xffu) /* inf / nan */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
    exp = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
    if (exp >= 0x1f) /* overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) { /* subnormal half or zero */
        uint32_t shift, half;
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        shift = (uint32_t)(14 - exp);
        hm = mant >> shift;
        rem = mant & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (hm & 1u)))
            hm++;
        return (uint16_t)(sign | hm);
    }
    hm = mant >> 13;
    rem = mant & 0x1fffu;
    x = sign | ((uint32_t)exp << 10) | hm;
    if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u)))
        x++; /* a carry into the exponent is still right */
    return (uint16_t)x;
}

static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    float f;
    if (exp == 0) {
        f = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24, exact */
        return sign ? -f : f;
    }
    if (exp == 0x1f)
        x = sign | 0x7f800000u | (mant << 13);
    else
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

static float bf2f(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static size_t dt_size(hccn_datatype dt)
{
    switch ((int)dt) {
    case HCCN_INT8: case HCCN_UINT8: return 1;
    case HCCN_INT16: case HCCN_UINT16: case HCCN_FP16: case HCCN_BF16: return 2;
    case HCCN_INT32: case HCCN_UINT32: case HCCN_FP32: return 4;
    default: return 8;
    }
}

static int dt_is_float(hccn_datatype dt)
{
    return dt == HCCN_FP16 || dt == HCCN_FP32 || dt == HCCN_FP64 || dt == HCCN_BF16;
}

static int dt_is_signed(hccn_datatype dt)
{
    return dt_is_float(dt) || dt == HCCN_INT8 || dt == HCCN_INT16 || dt == HCCN_INT32 || dt == HCCN_INT64;
}

/* Relative precision of the type, for AVG of floating types only. */
static double dt_eps(hccn_datatype dt)
{
    switch ((int)dt) {
    case HCCN_FP16: return 1.0 / 1024.0;
    case HCCN_BF16: return 1.0 / 128.0;
    case HCCN_FP32: return 1.0 / 8388608.0;
    default: return 1.0 / 4503599627370496.0;
    }
}

static void put(void *buf, uint64_t i, hccn_datatype dt, double v)
{
    switch ((int)dt) {
    case HCCN_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCCN_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case HCCN_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCCN_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HCCN_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HCCN_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case HCCN_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case HCCN_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case HCCN_FP16: ((uint16_t *)buf)[i] = f2h((float)v); break;
    case HCCN_BF16: ((uint16_t *)buf)[i] = f2bf((float)v); break;
    case HCCN_FP32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

static double get(const void *buf, uint64_t i, hccn_datatype dt)
{
    switch ((int)dt) {
    case HCCN_INT8: return ((const int8_t *)buf)[i];
    case HCCN_INT16: return ((const int16_t *)buf)[i];
    case HCCN_INT32: return ((const int32_t *)buf)[i];
    case HCCN_INT64: return (double)((const int64_t *)buf)[i];
    case HCCN_UINT8: return ((const uint8_t *)buf)[i];
    case HCCN_UINT16: return ((const uint16_t *)buf)[i];
    case HCCN_UINT32: return ((const uint32_t *)buf)[i];
    case HCCN_UINT64: return (double)((const uint64_t *)buf)[i];
    case HCCN_FP16: return h2f(((const uint16_t *)buf)[i]);
    case HCCN_BF16: return bf2f(((const uint16_t *)buf)[i]);
    case HCCN_FP32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

static double fabs_(double x) { return x < 0 ? -x : x; }

/* ------------------------------------------------------------------------------------------ */
/* Buffers and comparisons                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A receive buffer of `bytes` filled with GARBAGE, followed by GUARD guard bytes. */
static unsigned char *rbuf_new(size_t bytes)
{
    unsigned char *p = xmalloc(bytes + GUARD);
    memset(p, GARBAGE, bytes);
    memset(p + bytes, 0xA5, GUARD);
    return p;
}

static void check_guard(const char *what, const unsigned char *buf, size_t bytes, const char *ctx)
{
    size_t i;
    for (i = 0; i < GUARD; i++)
        if (buf[bytes + i] != 0xA5)
            break;
    CHECK(i == GUARD, "%s: wrote past the end of the buffer (byte %llu after it) %s", what, (ull)i, ctx);
}

/* Compares count elements with exp[] (exactly, or within tol[] when tol != NULL). */
static int check_array(const char *what, const void *buf, hccn_datatype dt, const double *exp,
                       const double *tol, uint64_t count, const char *ctx)
{
    uint64_t i, bad = 0, first = 0;
    for (i = 0; i < count; i++) {
        double g = get(buf, i, dt), t = tol ? tol[i] : 0.0;
        if (!(fabs_(g - exp[i]) <= t)) {
            if (!bad)
                first = i;
            bad++;
        }
    }
    if (bad == 0)
        return CHECK(1, "-");
    return CHECK(0, "%s: %llu of %llu elements wrong, first [%llu] = %.10g expected %.10g %s", what,
                 (ull)bad, (ull)count, (ull)first, get(buf, first, dt), exp[first], ctx);
}

static double *dalloc(uint64_t n) { return xmalloc((size_t)n * sizeof(double)); }

/* Values for reductions: element j of rank r; sums, products and averages of up to 8 ranks stay
 * exact in every type (BF16 holds integers up to 256, FP16 up to 2048). */
static uint64_t red_mod(hccn_datatype dt)
{
    switch ((int)dt) {
    case HCCN_INT8: return 15;    /* -7..7,   |sum| <= 56   */
    case HCCN_UINT8: return 31;   /* 1..31,   sum <= 248    */
    case HCCN_BF16: return 31;    /* -15..15, |sum| <= 120  */
    case HCCN_FP16: return 255;   /* -127..127, |sum| <= 1016 */
    case HCCN_INT16: return 2001; /* -1000..1000 */
    case HCCN_UINT16: return 4001;
    default: return 200003;       /* |sum| < 2^24: exact in FP32 too */
    }
}

static double red_val(hccn_datatype dt, hccn_reduce_op op, uint32_t r, uint64_t j)
{
    uint64_t m = red_mod(dt), u;
    if (op == HCCN_PROD) { /* at most 2 of 8 ranks hold 2 (and 2 hold -1): |product| <= 4 */
        unsigned k = (unsigned)((r + j) % 4);
        if (k == 0)
            return 2;
        if (k == 1 && dt_is_signed(dt))
            return -1;
        return 1;
    }
    u = (j * 7 + (uint64_t)r * 13 + j / 97) % m;
    return dt_is_signed(dt) ? (double)u - (double)(m / 2) : (double)u + 1;
}

static void red_fill(void *buf, hccn_datatype dt, hccn_reduce_op op, uint32_t r, uint64_t first,
                     uint64_t count)
{
    uint64_t i;
    for (i = 0; i < count; i++)
        put(buf, i, dt, red_val(dt, op, r, first + i));
}

/* Expected result of reducing elements first..first+count over ranks 0..n-1. AVG of integers
 * truncates toward zero (like ncclAvg); AVG of floats is allowed a few units of rounding. */
static void red_expect(double *exp, double *tol, hccn_datatype dt, hccn_reduce_op op, uint32_t n,
                       uint64_t first, uint64_t count)
{
    uint64_t i;
    uint32_t s;
    for (i = 0; i < count; i++) {
        double acc = red_val(dt, op, 0, first + i), mx = fabs_(acc);
        for (s = 1; s < n; s++) {
            double v = red_val(dt, op, s, first + i);
            if (fabs_(v) > mx)
                mx = fabs_(v);
            switch ((int)op) {
            case HCCN_PROD: acc *= v; break;
            case HCCN_MAX: acc = v > acc ? v : acc; break;
            case HCCN_MIN: acc = v < acc ? v : acc; break;
            default: acc += v; break;
            }
        }
        tol[i] = 0.0;
        if (op == HCCN_AVG) {
            acc /= (double)n;
            if (dt_is_float(dt))
                tol[i] = (double)(n + 2) * dt_eps(dt) * (mx + fabs_(acc));
            else
                acc = (double)(long long)acc; /* C conversion truncates toward zero */
        }
        exp[i] = acc;
    }
}

/* Values for data movement: small non-negative integers exact in the type. */
static double mv_val(hccn_datatype dt, uint64_t a, uint64_t b, uint64_t j)
{
    uint64_t m, x = a * 7919u + b * 104729u + j * 3u + j / 113u;
    switch ((int)dt) {
    case HCCN_INT8: m = 127; break;
    case HCCN_UINT8: case HCCN_BF16: m = 251; break;
    case HCCN_FP16: m = 2039; break;
    case HCCN_INT16: m = 30011; break;
    case HCCN_UINT16: m = 65521; break;
    default: m = 1000003; break;
    }
    return (double)(x % m);
}

static void mv_fill(void *buf, hccn_datatype dt, uint64_t a, uint64_t b, uint64_t count)
{
    uint64_t i;
    for (i = 0; i < count; i++)
        put(buf, i, dt, mv_val(dt, a, b, i));
}

static void mv_expect(double *exp, hccn_datatype dt, uint64_t a, uint64_t b, uint64_t count)
{
    uint64_t i;
    for (i = 0; i < count; i++)
        exp[i] = mv_val(dt, a, b, i);
}

/* After an out-of-place call: the const send buffer must be unchanged. */
static void check_send_unchanged(const char *what, const void *send, const void *copy, size_t bytes,
                                 const char *ctx)
{
    CHECK(memcmp(send, copy, bytes) == 0, "%s: modified its const send buffer %s", what, ctx);
}

static void *dup_bytes(const void *p, size_t bytes)
{
    void *q = xmalloc(bytes);
    if (bytes)
        memcpy(q, p, bytes);
    return q;
}

/* Synchronizes the stream a runner enqueued on (no-op for the blocking form). */
static int finish(hccn_stream *s, const char *what, const char *ctx)
{
    char w[96];
    if (!s)
        return 1;
    snprintf(w, sizeof w, "hccn_stream_synchronize after %s", what);
    return check_rc(hccn_stream_synchronize(s), HCCN_SUCCESS, w, ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* One run of each collective (stream NULL = blocking; otherwise enqueue, then synchronize)     */
/* ------------------------------------------------------------------------------------------ */

static void run_allreduce(hccn_datatype dt, hccn_reduce_op op, uint64_t count, int inplace, hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    unsigned char *send = rbuf_new(bytes), *recv = inplace ? send : rbuf_new(bytes), *copy;
    double *exp = dalloc(count), *tol = dalloc(count);
    const char *what = inplace ? "allreduce in place" : "allreduce";
    char ctx[96];
    mkctx(ctx, sizeof ctx, dt, (int)op, count, NO_ROOT);
    red_fill(send, dt, op, g_rank, 0, count);
    copy = dup_bytes(send, bytes);
    if (check_rc(hccn_allreduce(send, recv, count, dt, op, g_world, s), HCCN_SUCCESS, what, ctx) &&
        finish(s, what, ctx)) {
        red_expect(exp, tol, dt, op, g_size, 0, count);
        check_array(what, recv, dt, exp, tol, count, ctx);
        if (!inplace)
            check_send_unchanged(what, send, copy, bytes, ctx);
    }
    check_guard(what, recv, bytes, ctx);
    if (!inplace)
        free(recv);
    free(send);
    free(copy);
    free(exp);
    free(tol);
}

static void run_reduce(hccn_datatype dt, hccn_reduce_op op, uint64_t count, uint32_t root, int inplace,
                       hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    unsigned char *send = rbuf_new(bytes), *recv = inplace ? send : rbuf_new(bytes), *copy;
    double *exp = dalloc(count), *tol = dalloc(count);
    const char *what = inplace ? "reduce in place" : "reduce";
    char ctx[96];
    mkctx(ctx, sizeof ctx, dt, (int)op, count, (long)root);
    red_fill(send, dt, op, g_rank, 0, count);
    copy = dup_bytes(send, bytes);
    if (check_rc(hccn_reduce(send, recv, count, dt, op, root, g_world, s), HCCN_SUCCESS, what, ctx) &&
        finish(s, what, ctx)) {
        if (g_rank == root) {
            red_expect(exp, tol, dt, op, g_size, 0, count);
            check_array(what, recv, dt, exp, tol, count, ctx);
        }
        if (!inplace)
            check_send_unchanged(what, send, copy, bytes, ctx);
    }
    check_guard(what, recv, bytes, ctx);
    if (!inplace)
        free(recv);
    free(send);
    free(copy);
    free(exp);
    free(tol);
}

static void run_broadcast(hccn_datatype dt, uint64_t count, uint32_t root, hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    unsigned char *buf = rbuf_new(bytes);
    double *exp = dalloc(count);
    char ctx[96];
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, (long)root);
    if (g_rank == root)
        mv_fill(buf, dt, root, 1, count);
    if (check_rc(hccn_broadcast(buf, count, dt, root, g_world, s), HCCN_SUCCESS, "broadcast", ctx) &&
        finish(s, "broadcast", ctx)) {
        mv_expect(exp, dt, root, 1, count);
        check_array("broadcast", buf, dt, exp, NULL, count, ctx);
    }
    check_guard("broadcast", buf, bytes, ctx);
    free(buf);
    free(exp);
}

static void run_allgather(hccn_datatype dt, uint64_t count, int inplace, hccn_stream *s)
{
    size_t es = dt_size(dt), bytes = (size_t)count * es;
    unsigned char *recv = rbuf_new(bytes * g_size);
    unsigned char *send = inplace ? recv + (size_t)g_rank * bytes : rbuf_new(bytes), *copy;
    double *exp = dalloc(count);
    const char *what = inplace ? "allgather in place" : "allgather";
    char ctx[96];
    uint32_t b;
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, NO_ROOT);
    mv_fill(send, dt, g_rank, 2, count);
    copy = dup_bytes(send, bytes);
    if (check_rc(hccn_allgather(send, recv, count, dt, g_world, s), HCCN_SUCCESS, what, ctx) &&
        finish(s, what, ctx)) {
        for (b = 0; b < g_size; b++) {
            char w[64];
            snprintf(w, sizeof w, "%s block %u", what, (unsigned)b);
            mv_expect(exp, dt, b, 2, count);
            check_array(w, recv + (size_t)b * bytes, dt, exp, NULL, count, ctx);
        }
        if (!inplace)
            check_send_unchanged(what, send, copy, bytes, ctx);
    }
    check_guard(what, recv, bytes * g_size, ctx);
    if (!inplace)
        free(send);
    free(recv);
    free(copy);
    free(exp);
}

static void run_reduce_scatter(hccn_datatype dt, hccn_reduce_op op, uint64_t count, int inplace,
                               hccn_stream *s)
{
    size_t es = dt_size(dt), bytes = (size_t)count * es;
    unsigned char *send = rbuf_new(bytes * g_size), *copy;
    unsigned char *recv = inplace ? send + (size_t)g_rank * bytes : rbuf_new(bytes);
    double *exp = dalloc(count), *tol = dalloc(count);
    const char *what = inplace ? "reduce_scatter in place" : "reduce_scatter";
    char ctx[96];
    mkctx(ctx, sizeof ctx, dt, (int)op, count, NO_ROOT);
    red_fill(send, dt, op, g_rank, 0, count * g_size);
    copy = dup_bytes(send, bytes * g_size);
    if (check_rc(hccn_reduce_scatter(send, recv, count, dt, op, g_world, s), HCCN_SUCCESS, what, ctx) &&
        finish(s, what, ctx)) {
        red_expect(exp, tol, dt, op, g_size, (uint64_t)g_rank * count, count);
        check_array(what, recv, dt, exp, tol, count, ctx);
        if (!inplace)
            check_send_unchanged(what, send, copy, bytes * g_size, ctx);
    }
    check_guard(what, send, bytes * g_size, ctx);
    if (!inplace) {
        check_guard(what, recv, bytes, ctx);
        free(recv);
    }
    free(send);
    free(copy);
    free(exp);
    free(tol);
}

static void run_gather(hccn_datatype dt, uint64_t count, uint32_t root, hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    unsigned char *send = rbuf_new(bytes), *recv = rbuf_new(bytes * g_size), *copy;
    double *exp = dalloc(count);
    char ctx[96];
    uint32_t b;
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, (long)root);
    mv_fill(send, dt, g_rank, 3 + root, count);
    copy = dup_bytes(send, bytes);
    if (check_rc(hccn_gather(send, recv, count, dt, root, g_world, s), HCCN_SUCCESS, "gather", ctx) &&
        finish(s, "gather", ctx)) {
        if (g_rank == root) {
            for (b = 0; b < g_size; b++) {
                char w[64];
                snprintf(w, sizeof w, "gather block %u", (unsigned)b);
                mv_expect(exp, dt, b, 3 + root, count);
                check_array(w, recv + (size_t)b * bytes, dt, exp, NULL, count, ctx);
            }
        }
        check_send_unchanged("gather", send, copy, bytes, ctx);
    }
    check_guard("gather", recv, bytes * g_size, ctx);
    free(send);
    free(recv);
    free(copy);
    free(exp);
}

/* In place the root's output is its own block of the input (MPI_IN_PLACE's shape). */
static void run_scatter(hccn_datatype dt, uint64_t count, uint32_t root, int inplace, hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    int own = inplace && g_rank == root;
    unsigned char *send = rbuf_new(bytes * g_size), *copy;
    unsigned char *recv = own ? send + (size_t)root * bytes : rbuf_new(bytes);
    double *exp = dalloc(count);
    const char *what = inplace ? "scatter in place" : "scatter";
    char ctx[96];
    uint32_t b;
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, (long)root);
    if (g_rank == root)
        for (b = 0; b < g_size; b++)
            mv_fill(send + (size_t)b * bytes, dt, root, 100 + b, count);
    copy = dup_bytes(send, bytes * g_size);
    if (check_rc(hccn_scatter(send, recv, count, dt, root, g_world, s), HCCN_SUCCESS, what, ctx) &&
        finish(s, what, ctx)) {
        mv_expect(exp, dt, root, 100 + g_rank, count);
        check_array(what, recv, dt, exp, NULL, count, ctx);
        check_send_unchanged(what, send, copy, bytes * g_size, ctx);
    }
    check_guard(what, send, bytes * g_size, ctx);
    if (!own) {
        check_guard(what, recv, bytes, ctx);
        free(recv);
    }
    free(send);
    free(copy);
    free(exp);
}

static void run_alltoall(hccn_datatype dt, uint64_t count, hccn_stream *s)
{
    size_t bytes = (size_t)count * dt_size(dt);
    unsigned char *send = rbuf_new(bytes * g_size), *recv = rbuf_new(bytes * g_size), *copy;
    double *exp = dalloc(count);
    char ctx[96];
    uint32_t b;
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, NO_ROOT);
    for (b = 0; b < g_size; b++) /* block b goes to rank b */
        mv_fill(send + (size_t)b * bytes, dt, g_rank, 200 + b, count);
    copy = dup_bytes(send, bytes * g_size);
    if (check_rc(hccn_alltoall(send, recv, count, dt, g_world, s), HCCN_SUCCESS, "alltoall", ctx) &&
        finish(s, "alltoall", ctx)) {
        for (b = 0; b < g_size; b++) { /* block b came from rank b */
            char w[64];
            snprintf(w, sizeof w, "alltoall block from rank %u", (unsigned)b);
            mv_expect(exp, dt, b, 200 + g_rank, count);
            check_array(w, recv + (size_t)b * bytes, dt, exp, NULL, count, ctx);
        }
        check_send_unchanged("alltoall", send, copy, bytes * g_size, ctx);
    }
    check_guard("alltoall", recv, bytes * g_size, ctx);
    free(send);
    free(recv);
    free(copy);
    free(exp);
}

/* Places n blocks of counts[] with `gap` unused elements before each one, in rank order or
 * reversed; returns the buffer length in elements. */
static uint64_t place(uint64_t *displs, const uint64_t *counts, uint32_t n, int reverse, uint64_t gap)
{
    uint64_t off = 0;
    uint32_t k;
    for (k = 0; k < n; k++) {
        uint32_t i = reverse ? n - 1 - k : k;
        off += gap;
        displs[i] = off;
        off += counts[i];
    }
    return off + gap;
}

/* Checks that every element outside the n blocks still holds GARBAGE. */
static void check_gaps(const char *what, const unsigned char *buf, hccn_datatype dt, uint64_t total,
                       const uint64_t *counts, const uint64_t *displs, uint32_t n, const char *ctx)
{
    size_t es = dt_size(dt);
    unsigned char *used = xmalloc((size_t)total);
    uint64_t i, bad = 0;
    uint32_t b;
    size_t k;
    memset(used, 0, (size_t)total);
    for (b = 0; b < n; b++)
        for (i = 0; i < counts[b]; i++)
            used[displs[b] + i] = 1;
    for (i = 0; i < total; i++)
        if (!used[i])
            for (k = 0; k < es; k++)
                if (buf[i * es + k] != GARBAGE) {
                    bad++;
                    break;
                }
    CHECK(bad == 0, "%s: wrote %llu elements outside the blocks given by counts/displacements %s", what,
          (ull)bad, ctx);
    free(used);
}

/* pattern 0: counts i+1, packed; 1: counts (5i+3)%7 (some 0), reversed with gaps; 2: 0 on even
 * ranks (rank 0 sends nothing), gaps. All counts are multiplied by scale. */
static uint64_t allgatherv_count(int pattern, uint32_t i, uint64_t scale)
{
    switch (pattern) {
    case 0: return (i + 1) * scale;
    case 1: return ((i * 5 + 3) % 7) * scale;
    default: return (i % 2) ? 3 * scale : 0;
    }
}

static void run_allgatherv(hccn_datatype dt, int pattern, uint64_t scale, hccn_stream *s)
{
    uint64_t counts[MAX_RANKS], displs[MAX_RANKS], total, mine;
    size_t es = dt_size(dt);
    unsigned char *send, *recv, *copy;
    double *exp;
    char ctx[128], c0[96];
    uint32_t b;
    for (b = 0; b < g_size; b++)
        counts[b] = allgatherv_count(pattern, b, scale);
    total = place(displs, counts, g_size, pattern == 1, pattern == 0 ? 0 : 3);
    mine = counts[g_rank];
    mkctx(c0, sizeof c0, dt, NO_OP, mine, NO_ROOT);
    snprintf(ctx, sizeof ctx, "%s pattern %d", c0, pattern);
    send = rbuf_new((size_t)mine * es);
    recv = rbuf_new((size_t)total * es);
    exp = dalloc(total);
    mv_fill(send, dt, g_rank, 300, mine);
    copy = dup_bytes(send, (size_t)mine * es);
    if (check_rc(hccn_allgatherv(send, mine, recv, counts, displs, dt, g_world, s), HCCN_SUCCESS,
                 "allgatherv", ctx) &&
        finish(s, "allgatherv", ctx)) {
        for (b = 0; b < g_size; b++) {
            char w[64];
            snprintf(w, sizeof w, "allgatherv block %u", (unsigned)b);
            mv_expect(exp, dt, b, 300, counts[b]);
            check_array(w, recv + (size_t)displs[b] * es, dt, exp, NULL, counts[b], ctx);
        }
        check_gaps("allgatherv", recv, dt, total, counts, displs, g_size, ctx);
        check_send_unchanged("allgatherv", send, copy, (size_t)mine * es, ctx);
    }
    check_guard("allgatherv", recv, (size_t)total * es, ctx);
    free(send);
    free(recv);
    free(copy);
    free(exp);
}

/* Elements that rank src sends to rank dst (some are 0). */
static uint64_t a2av_count(uint32_t src, uint32_t dst, uint64_t scale)
{
    return (uint64_t)((src * 3 + dst * 5 + 1) % 4) * scale;
}

static void run_alltoallv(hccn_datatype dt, uint64_t scale, hccn_stream *s)
{
    uint64_t sc[MAX_RANKS], sd[MAX_RANKS], rc[MAX_RANKS], rd[MAX_RANKS], stotal, rtotal;
    size_t es = dt_size(dt);
    unsigned char *send, *recv, *copy;
    double *exp;
    char ctx[96];
    uint32_t b;
    for (b = 0; b < g_size; b++) {
        sc[b] = a2av_count(g_rank, b, scale);
        rc[b] = a2av_count(b, g_rank, scale);
    }
    stotal = place(sd, sc, g_size, 1, 2); /* send blocks reversed, with gaps */
    rtotal = place(rd, rc, g_size, 0, 1);
    mkctx(ctx, sizeof ctx, dt, NO_OP, scale, NO_ROOT);
    send = rbuf_new((size_t)stotal * es);
    recv = rbuf_new((size_t)rtotal * es);
    exp = dalloc(rtotal);
    for (b = 0; b < g_size; b++)
        mv_fill(send + (size_t)sd[b] * es, dt, g_rank, 400 + b, sc[b]);
    copy = dup_bytes(send, (size_t)stotal * es);
    if (check_rc(hccn_alltoallv(send, sc, sd, recv, rc, rd, dt, g_world, s), HCCN_SUCCESS, "alltoallv",
                 ctx) &&
        finish(s, "alltoallv", ctx)) {
        for (b = 0; b < g_size; b++) {
            char w[64];
            snprintf(w, sizeof w, "alltoallv block from rank %u", (unsigned)b);
            mv_expect(exp, dt, b, 400 + g_rank, rc[b]);
            check_array(w, recv + (size_t)rd[b] * es, dt, exp, NULL, rc[b], ctx);
        }
        check_gaps("alltoallv", recv, dt, rtotal, rc, rd, g_size, ctx);
        check_send_unchanged("alltoallv", send, copy, (size_t)stotal * es, ctx);
    }
    check_guard("alltoallv", recv, (size_t)rtotal * es, ctx);
    free(send);
    free(recv);
    free(copy);
    free(exp);
}

/* Ring exchange r -> r+1 (even ranks send first, odd ranks receive first: no cycle of waits). */
static void run_sendrecv(hccn_datatype dt, uint64_t count)
{
    size_t bytes = (size_t)count * dt_size(dt);
    uint32_t next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    unsigned char *send = rbuf_new(bytes), *recv = rbuf_new(bytes), *copy;
    double *exp = dalloc(count);
    hccn_result rs = HCCN_SUCCESS, rr = HCCN_SUCCESS;
    char ctx[96];
    mkctx(ctx, sizeof ctx, dt, NO_OP, count, NO_ROOT);
    mv_fill(send, dt, g_rank, 500, count);
    copy = dup_bytes(send, bytes);
    if (g_rank % 2 == 0) {
        rs = hccn_send(send, count, dt, next, g_world, NULL);
        rr = hccn_recv(recv, count, dt, prev, g_world, NULL);
    } else {
        rr = hccn_recv(recv, count, dt, prev, g_world, NULL);
        rs = hccn_send(send, count, dt, next, g_world, NULL);
    }
    check_rc(rs, HCCN_SUCCESS, "send to rank+1", ctx);
    if (check_rc(rr, HCCN_SUCCESS, "recv from rank-1", ctx)) {
        mv_expect(exp, dt, prev, 500, count);
        check_array("recv from rank-1", recv, dt, exp, NULL, count, ctx);
    }
    check_send_unchanged("send", send, copy, bytes, ctx);
    check_guard("recv", recv, bytes, ctx);
    free(send);
    free(recv);
    free(copy);
    free(exp);
}

/* ------------------------------------------------------------------------------------------ */
/* Sections                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Runs on a new thread: its last error starts empty, and its own failure stays on it. */
static void *last_error_thread(void *arg)
{
    int *ok = arg;
    const char *msg = hccn_get_last_error();
    ok[0] = msg != NULL && msg[0] == '\0';
    ok[1] = hccn_get_version(NULL) != HCCN_SUCCESS;
    msg = hccn_get_last_error();
    ok[2] = msg != NULL && msg[0] != '\0';
    return NULL;
}

static void test_last_error_is_thread_local(void)
{
    char before[512];
    int ok[3] = {0, 0, 0};
    uint32_t r;
    pthread_t t;
    expect_fail(hccn_comm_rank(NULL, &r), HCCN_ERROR_NULL_POINTER, "hccn_comm_rank(NULL, &rank)");
    snprintf(before, sizeof before, "%s", hccn_get_last_error());
    if (!CHECK(pthread_create(&t, NULL, last_error_thread, ok) == 0, "pthread_create failed"))
        return;
    pthread_join(t, NULL);
    CHECK(ok[0], "hccn_get_last_error() on a new thread is not \"\" after a failure on another thread");
    CHECK(ok[1] && ok[2], "hccn_get_version(NULL) on a second thread: no error or no message");
    CHECK(strcmp(before, hccn_get_last_error()) == 0,
          "a failure on another thread changed this thread's hccn_get_last_error() from \"%s\" to \"%s\"",
          before, hccn_get_last_error());
}

static void test_library(void)
{
    static const hccn_result codes[] = {
        HCCN_SUCCESS, HCCN_ERROR_INVALID_ARGUMENT, HCCN_ERROR_NULL_POINTER, HCCN_ERROR_OUT_OF_MEMORY,
        HCCN_ERROR_INTERNAL, HCCN_ERROR_NOT_SUPPORTED, HCCN_ERROR_NOT_FOUND, HCCN_ERROR_UNAVAILABLE,
        HCCN_ERROR_SYSTEM, HCCN_ERROR_TIMEOUT, HCCN_ERROR_CONNECT, HCCN_ERROR_TRANSFER,
        HCCN_ERROR_BACKEND, HCCN_ERROR_REMOTE, HCCN_ERROR_RANK_FAILED, HCCN_ERROR_REVOKED,
        HCCN_ERROR_ABORTED, HCCN_IN_PROGRESS, HCCN_ERROR_AUTH, HCCN_ERROR_STORE, HCCN_ERROR_STALE_EPOCH};
    int32_t version = -1;
    uint32_t r = 0xDEADBEEFu;
    size_t i;
    const char *str;
    section("library");
    /* the enum numbers are part of the contract (same as HcclResult / HcclDataType / HcclReduceOp) */
    CHECK(HCCN_ERROR_INVALID_ARGUMENT == 1 && HCCN_ERROR_NULL_POINTER == 2 && HCCN_ERROR_TIMEOUT == 9 &&
              HCCN_ERROR_CONNECT == 11 && HCCN_ERROR_REMOTE == 21 && HCCN_ERROR_RANK_FAILED == 100 &&
              HCCN_IN_PROGRESS == 103 && HCCN_ERROR_STALE_EPOCH == 106,
          "hccn_result numbers differ from API.md");
    CHECK(HCCN_INT8 == 0 && HCCN_FP16 == 3 && HCCN_FP32 == 4 && HCCN_UINT64 == 6 && HCCN_UINT8 == 7 &&
              HCCN_FP64 == 10 && HCCN_BF16 == 11,
          "hccn_datatype numbers differ from API.md");
    CHECK(HCCN_SUM == 0 && HCCN_PROD == 1 && HCCN_MAX == 2 && HCCN_MIN == 3 && HCCN_AVG == 4,
          "hccn_reduce_op numbers differ from API.md");
    CHECK(sizeof(hccn_unique_id) == 128, "sizeof(hccn_unique_id) = %llu, expected 128",
          (ull)sizeof(hccn_unique_id));

    check_rc(hccn_get_version(&version), HCCN_SUCCESS, "hccn_get_version", "");
    CHECK(version > 0, "hccn_get_version gave %d, expected a positive number", (int)version);
    expect_fail(hccn_get_version(NULL), HCCN_ERROR_NULL_POINTER, "hccn_get_version(NULL)");

    for (i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        str = hccn_get_error_string(codes[i]);
        CHECK(str != NULL && str[0] != '\0', "hccn_get_error_string(%d) is %s", (int)codes[i],
              str ? "\"\"" : "NULL");
    }
    str = hccn_get_error_string((hccn_result)9999);
    CHECK(str != NULL, "hccn_get_error_string(9999) is NULL");

    check_rc(hccn_comm_destroy(NULL), HCCN_SUCCESS, "hccn_comm_destroy(NULL)", "");
    expect_fail(hccn_comm_rank(NULL, &r), HCCN_ERROR_NULL_POINTER, "hccn_comm_rank(NULL, &rank)");
    CHECK(r == 0xDEADBEEFu, "hccn_comm_rank(NULL, &rank) wrote its output on failure");
    expect_fail(hccn_comm_size(NULL, &r), HCCN_ERROR_NULL_POINTER, "hccn_comm_size(NULL, &size)");
    CHECK(r == 0xDEADBEEFu, "hccn_comm_size(NULL, &size) wrote its output on failure");
    expect_fail(hccn_comm_rank(g_world, NULL), HCCN_ERROR_NULL_POINTER, "hccn_comm_rank(comm, NULL)");
    expect_fail(hccn_comm_size(g_world, NULL), HCCN_ERROR_NULL_POINTER, "hccn_comm_size(comm, NULL)");
    expect_fail(hccn_init_from_env(NULL), HCCN_ERROR_NULL_POINTER, "hccn_init_from_env(NULL)");
    expect_fail(hccn_get_unique_id(NULL), HCCN_ERROR_NULL_POINTER, "hccn_get_unique_id(NULL)");
    test_last_error_is_thread_local();
}

/* FP16 / BF16 helpers agree with known bit patterns and round-trip the integers we use. */
static void test_converters(void)
{
    int i, bad = 0;
    section("converters");
    CHECK(f2h(1.0f) == 0x3c00 && f2h(-2.0f) == 0xc000 && f2h(65504.0f) == 0x7bff && f2h(0.5f) == 0x3800,
          "self-test: float -> fp16");
    CHECK(h2f(0x3c00) == 1.0f && h2f(0xc000) == -2.0f && h2f(0x0001) == 1.0f / 16777216.0f,
          "self-test: fp16 -> float");
    CHECK(f2bf(1.0f) == 0x3f80 && f2bf(-2.0f) == 0xc000 && bf2f(0x4040) == 3.0f, "self-test: bf16");
    for (i = -2048; i <= 2048; i++)
        bad += h2f(f2h((float)i)) != (float)i;
    for (i = -256; i <= 256; i++)
        bad += bf2f(f2bf((float)i)) != (float)i;
    CHECK(bad == 0, "self-test: %d small integers do not round-trip through fp16/bf16", bad);
}

static void test_allreduce(void)
{
    static const struct {
        hccn_datatype dt;
        hccn_reduce_op op;
        uint64_t count;
    } big[] = {{HCCN_FP32, HCCN_SUM, 300000}, {HCCN_FP64, HCCN_AVG, 100003}, {HCCN_INT32, HCCN_MAX, 100003},
               {HCCN_INT64, HCCN_MIN, 100003}, {HCCN_BF16, HCCN_SUM, 65537},  {HCCN_UINT8, HCCN_MIN, 65537},
               {HCCN_FP16, HCCN_PROD, 65537},  {HCCN_INT8, HCCN_AVG, 65537}};
    size_t d, o, c;
    section("allreduce");
    for (d = 0; d < N_DT; d++)
        for (o = 0; o < N_OP; o++)
            for (c = 0; c < N_COUNTS; c++) {
                run_allreduce(ALL_DT[d], ALL_OP[o], COUNTS[c], 0, NULL);
                run_allreduce(ALL_DT[d], ALL_OP[o], COUNTS[c], 1, NULL);
            }
    section("allreduce large");
    for (c = 0; c < sizeof big / sizeof big[0]; c++) {
        run_allreduce(big[c].dt, big[c].op, big[c].count, 0, NULL);
        run_allreduce(big[c].dt, big[c].op, big[c].count, 1, NULL);
    }
}

static void test_reduce(void)
{
    size_t d, o, c;
    uint32_t root;
    section("reduce");
    for (root = 0; root < g_size; root++)
        for (d = 0; d < N_DT; d++)
            for (o = 0; o < N_OP; o++)
                for (c = 0; c < N_COUNTS; c++)
                    run_reduce(ALL_DT[d], ALL_OP[o], COUNTS[c], root, (int)(c % 2), NULL);
    for (root = 0; root < g_size; root++) {
        run_reduce(HCCN_FP32, HCCN_SUM, 7, root, 0, NULL);
        run_reduce(HCCN_INT32, HCCN_MAX, 1023, root, 1, NULL);
        run_reduce(HCCN_FP32, HCCN_SUM, 300000, root, root % 2, NULL);
    }
}

static void test_broadcast(void)
{
    size_t d, c;
    uint32_t root;
    section("broadcast");
    for (root = 0; root < g_size; root++) {
        for (d = 0; d < N_DT; d++)
            for (c = 0; c < N_COUNTS; c++)
                run_broadcast(ALL_DT[d], COUNTS[c], root, NULL);
        run_broadcast(HCCN_FP32, 300000, root, NULL);
    }
    run_broadcast(HCCN_UINT8, 1000003, g_size - 1, NULL);
}

static void test_allgather(void)
{
    size_t d, c;
    int p;
    section("allgather");
    for (d = 0; d < N_DT; d++)
        for (c = 0; c < N_COUNTS; c++) {
            run_allgather(ALL_DT[d], COUNTS[c], 0, NULL);
            run_allgather(ALL_DT[d], COUNTS[c], 1, NULL);
        }
    run_allgather(HCCN_FP32, 100003, 0, NULL);
    run_allgather(HCCN_FP32, 100003, 1, NULL);
    section("allgatherv");
    for (d = 0; d < N_DT; d++)
        for (p = 0; p < 3; p++)
            run_allgatherv(ALL_DT[d], p, 1, NULL);
    for (p = 0; p < 3; p++)
        run_allgatherv(HCCN_FP64, p, 20011, NULL);
}

static void test_reduce_scatter(void)
{
    size_t d, o, c;
    section("reduce_scatter");
    for (d = 0; d < N_DT; d++)
        for (o = 0; o < N_OP; o++)
            for (c = 0; c < N_COUNTS; c++) {
                run_reduce_scatter(ALL_DT[d], ALL_OP[o], COUNTS[c], 0, NULL);
                run_reduce_scatter(ALL_DT[d], ALL_OP[o], COUNTS[c], 1, NULL);
            }
    run_reduce_scatter(HCCN_FP32, HCCN_SUM, 100003, 0, NULL);
    run_reduce_scatter(HCCN_FP32, HCCN_SUM, 100003, 1, NULL);
    run_reduce_scatter(HCCN_BF16, HCCN_AVG, 30011, 0, NULL);
}

static void test_gather_scatter(void)
{
    size_t d, c;
    uint32_t root;
    section("gather / scatter");
    for (root = 0; root < g_size; root++) {
        for (d = 0; d < N_DT; d++)
            for (c = 0; c < N_COUNTS; c++) {
                run_gather(ALL_DT[d], COUNTS[c], root, NULL);
                run_scatter(ALL_DT[d], COUNTS[c], root, 0, NULL);
                run_scatter(ALL_DT[d], COUNTS[c], root, 1, NULL);
            }
        run_gather(HCCN_FP32, 100003, root, NULL);
        run_scatter(HCCN_FP32, 100003, root, 0, NULL);
        run_scatter(HCCN_FP32, 100003, root, 1, NULL);
    }
}

static void test_alltoall(void)
{
    size_t d, c;
    section("alltoall / alltoallv");
    for (d = 0; d < N_DT; d++) {
        for (c = 0; c < N_COUNTS; c++)
            run_alltoall(ALL_DT[d], COUNTS[c], NULL);
        run_alltoallv(ALL_DT[d], 1, NULL);
        run_alltoallv(ALL_DT[d], 7, NULL);
    }
    run_alltoall(HCCN_INT32, 50021, NULL);
    run_alltoallv(HCCN_FP32, 30011, NULL);
}

static void test_sendrecv_barrier(void)
{
    size_t d, c;
    int i;
    section("send / recv");
    if (g_size >= 2) { /* with one rank the ring is a self-send, which API.md does not define */
        for (d = 0; d < N_DT; d++)
            for (c = 0; c < N_COUNTS; c++)
                run_sendrecv(ALL_DT[d], COUNTS[c]);
        run_sendrecv(HCCN_FP32, 300000);
    }
    section("barrier");
    for (i = 0; i < 3; i++)
        check_rc(hccn_barrier(g_world, NULL), HCCN_SUCCESS, "barrier", "");
}

/* An allreduce whose result is checked: the communicator still works. */
static void still_works(const char *after)
{
    char what[128];
    uint64_t before = g_fail;
    snprintf(what, sizeof what, "allreduce after %s", after);
    run_allreduce(HCCN_FP32, HCCN_SUM, 1023, 0, NULL);
    CHECK(before == g_fail, "the communicator no longer works: %s failed", what);
}

static int unchanged(const unsigned char *buf, size_t bytes)
{
    size_t i;
    for (i = 0; i < bytes; i++)
        if (buf[i] != GARBAGE)
            return 0;
    return 1;
}

static void test_bad_input(void)
{
    enum { C = 8 };
    const uint64_t huge = UINT64_MAX / 2;
    const uint32_t n = g_size;
    unsigned char *a = rbuf_new(4 * (C + 1) * MAX_RANKS), *b = rbuf_new(4 * (C + 1) * MAX_RANKS);
    const size_t abytes = 4 * (C + 1) * MAX_RANKS;
    uint64_t counts[MAX_RANKS], displs[MAX_RANKS];
    uint32_t i, ranks[2];
    hccn_comm *sentinel = (hccn_comm *)(void *)&sentinel, *out, *dup;
    hccn_unique_id zero_id;
    hccn_stream *st;
    /* with one rank every peer is this rank, and API.md leaves self-send undefined */
    const int null_p2p = n > 1 ? HCCN_ERROR_NULL_POINTER : ANY_ERROR;

    section("bad input");
    for (i = 0; i < n; i++) {
        counts[i] = C;
        displs[i] = (uint64_t)i * C;
    }
    red_fill(a, HCCN_FP32, HCCN_SUM, g_rank, 0, C);

    /* null pointers */
    expect_fail(hccn_allreduce(NULL, b, C, HCCN_FP32, HCCN_SUM, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "allreduce(sendbuf NULL)");
    CHECK(unchanged(b, abytes), "allreduce(sendbuf NULL) changed recvbuf");
    expect_fail(hccn_allreduce(a, NULL, C, HCCN_FP32, HCCN_SUM, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "allreduce(recvbuf NULL)");
    expect_fail(hccn_allreduce(a, b, C, HCCN_FP32, HCCN_SUM, NULL, NULL), HCCN_ERROR_NULL_POINTER,
                "allreduce(comm NULL)");
    CHECK(unchanged(b, abytes), "allreduce(comm NULL) changed recvbuf");
    expect_fail(hccn_broadcast(NULL, C, HCCN_FP32, 0, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "broadcast(buf NULL)");
    expect_fail(hccn_allgather(NULL, b, C, HCCN_FP32, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "allgather(sendbuf NULL)");
    expect_fail(hccn_allgatherv(a, C, b, NULL, displs, HCCN_FP32, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "allgatherv(recvcounts NULL)");
    expect_fail(hccn_allgatherv(a, C, b, counts, NULL, HCCN_FP32, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "allgatherv(displs NULL)");
    expect_fail(hccn_reduce_scatter(a, NULL, C, HCCN_FP32, HCCN_SUM, g_world, NULL),
                HCCN_ERROR_NULL_POINTER, "reduce_scatter(recvbuf NULL)");
    expect_fail(hccn_gather(NULL, b, C, HCCN_FP32, 0, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "gather(sendbuf NULL)");
    expect_fail(hccn_scatter(a, NULL, C, HCCN_FP32, 0, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "scatter(recvbuf NULL)");
    expect_fail(hccn_alltoall(a, NULL, C, HCCN_FP32, g_world, NULL), HCCN_ERROR_NULL_POINTER,
                "alltoall(recvbuf NULL)");
    expect_fail(hccn_alltoallv(a, NULL, displs, b, counts, displs, HCCN_FP32, g_world, NULL),
                HCCN_ERROR_NULL_POINTER, "alltoallv(sendcounts NULL)");
    expect_fail(hccn_alltoallv(a, counts, displs, b, counts, NULL, HCCN_FP32, g_world, NULL),
                HCCN_ERROR_NULL_POINTER, "alltoallv(rdispls NULL)");
    expect_fail(hccn_send(NULL, C, HCCN_FP32, (g_rank + 1) % n, g_world, NULL), null_p2p, "send(buf NULL)");
    expect_fail(hccn_recv(NULL, C, HCCN_FP32, (g_rank + 1) % n, g_world, NULL), null_p2p, "recv(buf NULL)");
    expect_fail(hccn_barrier(NULL, NULL), HCCN_ERROR_NULL_POINTER, "barrier(comm NULL)");
    still_works("null pointers");

    /* A NULL recvbuf of reduce on every rank: API.md makes every null pointer an error. A library
     * that checked it on the root only would let the other ranks start the reduce without the
     * root, so this runs on a duplicate of the world that is thrown away afterwards. */
    if (check_rc(hccn_comm_split(g_world, 0, (int32_t)g_rank, &dup), HCCN_SUCCESS,
                 "hccn_comm_split(0, rank) (duplicate)", "")) {
        expect_fail(hccn_reduce(a, NULL, C, HCCN_FP32, HCCN_SUM, 0, dup, NULL), HCCN_ERROR_NULL_POINTER,
                    "reduce(recvbuf NULL on every rank, root 0)");
        check_rc(hccn_comm_destroy(dup), HCCN_SUCCESS, "hccn_comm_destroy(duplicate)", "");
    }
    still_works("reduce(recvbuf NULL)");

    /* unknown data type and reduce op */
    expect_fail(hccn_allreduce(a, b, C, (hccn_datatype)99, HCCN_SUM, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "allreduce(dtype 99)");
    CHECK(unchanged(b, abytes), "allreduce(dtype 99) changed recvbuf");
    expect_fail(hccn_allreduce(a, b, C, (hccn_datatype)12, HCCN_SUM, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "allreduce(dtype 12)");
    expect_fail(hccn_allreduce(a, b, C, HCCN_FP32, (hccn_reduce_op)99, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "allreduce(op 99)");
    expect_fail(hccn_allreduce(a, b, C, HCCN_FP32, (hccn_reduce_op)5, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "allreduce(op 5)");
    CHECK(unchanged(b, abytes), "allreduce(op 5) changed recvbuf");
    expect_fail(hccn_reduce(a, b, C, HCCN_FP32, (hccn_reduce_op)99, 0, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "reduce(op 99)");
    expect_fail(hccn_reduce_scatter(a, b, 1, HCCN_INT32, (hccn_reduce_op)5, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "reduce_scatter(op 5)");
    expect_fail(hccn_broadcast(b, C, (hccn_datatype)99, 0, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "broadcast(dtype 99)");
    expect_fail(hccn_allgather(a, b, 1, (hccn_datatype)99, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "allgather(dtype 99)");
    expect_fail(hccn_alltoall(a, b, 1, (hccn_datatype)12, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "alltoall(dtype 12)");
    expect_fail(hccn_send(a, C, (hccn_datatype)99, (g_rank + 1) % n, g_world, NULL),
                HCCN_ERROR_INVALID_ARGUMENT, "send(dtype 99)");
    still_works("unknown dtype / op");

    /* out-of-range root and peer */
    expect_fail(hccn_broadcast(b, C, HCCN_FP32, n, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "broadcast(root = size)");
    CHECK(unchanged(b, abytes), "broadcast(root = size) changed buf");
    expect_fail(hccn_broadcast(b, C, HCCN_FP32, UINT32_MAX, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "broadcast(root = UINT32_MAX)");
    expect_fail(hccn_reduce(a, b, C, HCCN_FP32, HCCN_SUM, n, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "reduce(root = size)");
    expect_fail(hccn_gather(a, b, C, HCCN_FP32, n, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "gather(root = size)");
    expect_fail(hccn_scatter(a, b, C, HCCN_FP32, n + 5, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "scatter(root = size + 5)");
    CHECK(unchanged(b, abytes), "scatter(root = size + 5) changed recvbuf");
    expect_fail(hccn_send(a, C, HCCN_FP32, n, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "send(peer = size)");
    expect_fail(hccn_recv(b, C, HCCN_FP32, n, g_world, NULL), HCCN_ERROR_INVALID_ARGUMENT,
                "recv(peer = size)");
    CHECK(unchanged(b, abytes), "recv(peer = size) changed buf");
    still_works("out-of-range root / peer");

    /* overflowing counts */
    expect_fail(hccn_allreduce(a, b, huge, HCCN_FP32, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "allreduce(count UINT64_MAX/2 of FP32)");
    CHECK(unchanged(b, abytes), "allreduce(count UINT64_MAX/2) changed recvbuf");
    expect_fail(hccn_allreduce(a, b, UINT64_MAX, HCCN_UINT8, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "allreduce(count UINT64_MAX of UINT8)");
    expect_fail(hccn_broadcast(b, huge, HCCN_FP64, 0, g_world, NULL), ANY_ERROR,
                "broadcast(count UINT64_MAX/2 of FP64)");
    expect_fail(hccn_allgather(a, b, huge, HCCN_FP32, g_world, NULL), ANY_ERROR,
                "allgather(sendcount UINT64_MAX/2 of FP32)");
    expect_fail(hccn_alltoall(a, b, UINT64_MAX / 3, HCCN_INT16, g_world, NULL), ANY_ERROR,
                "alltoall(count UINT64_MAX/3 of INT16)");
    expect_fail(hccn_reduce_scatter(a, b, huge, HCCN_FP32, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "reduce_scatter(recvcount UINT64_MAX/2 of FP32)");
    expect_fail(hccn_send(a, huge, HCCN_FP32, (g_rank + 1) % n, g_world, NULL), ANY_ERROR,
                "send(count UINT64_MAX/2 of FP32)");
    CHECK(unchanged(b, abytes), "calls with overflowing counts changed a buffer");
    still_works("overflowing counts");

    /* forbidden buffer overlaps (all ranks make the same call) */
    memset(b, GARBAGE, abytes);
    expect_fail(hccn_allreduce(b, b + 4, C, HCCN_FP32, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "allreduce(recvbuf = sendbuf + 1 element)");
    CHECK(unchanged(b, abytes), "allreduce with overlapping buffers changed them");
    expect_fail(hccn_allreduce(b + 4, b, C, HCCN_FP32, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "allreduce(sendbuf = recvbuf + 1 element)");
    expect_fail(hccn_alltoall(b, b, C, HCCN_FP32, g_world, NULL), ANY_ERROR,
                "alltoall in place (sendbuf == recvbuf)");
    CHECK(unchanged(b, abytes), "alltoall in place changed the buffer");
    expect_fail(hccn_allgather(b + 4, b, C, HCCN_FP32, g_world, NULL), ANY_ERROR,
                "allgather(sendbuf = recvbuf + 1 element, not + rank*sendcount)");
    expect_fail(hccn_reduce_scatter(b, b + 4, C, HCCN_FP32, HCCN_SUM, g_world, NULL), ANY_ERROR,
                "reduce_scatter(recvbuf = sendbuf + 1 element, not + rank*recvcount)");
    CHECK(unchanged(b, abytes), "calls with overlapping buffers changed them");
    still_works("forbidden overlaps");

    /* objects */
    expect_fail(hccn_stream_create(NULL), HCCN_ERROR_NULL_POINTER, "hccn_stream_create(NULL)");
    expect_fail(hccn_event_create(NULL), HCCN_ERROR_NULL_POINTER, "hccn_event_create(NULL)");
    expect_fail(hccn_event_query(NULL), HCCN_ERROR_NULL_POINTER, "hccn_event_query(NULL)");
    expect_fail(hccn_event_synchronize(NULL), HCCN_ERROR_NULL_POINTER, "hccn_event_synchronize(NULL)");
    if (check_rc(hccn_stream_create(&st), HCCN_SUCCESS, "hccn_stream_create", "")) {
        expect_fail(hccn_event_record(NULL, st), HCCN_ERROR_NULL_POINTER, "hccn_event_record(NULL, stream)");
        /* a bad call on a stream fails at once and queues nothing */
        expect_fail(hccn_allreduce(a, b, C, (hccn_datatype)99, HCCN_SUM, g_world, st),
                    HCCN_ERROR_INVALID_ARGUMENT, "allreduce(dtype 99) on a stream");
        expect_fail(hccn_broadcast(b, C, HCCN_FP32, n, g_world, st), HCCN_ERROR_INVALID_ARGUMENT,
                    "broadcast(root = size) on a stream");
        check_rc(hccn_stream_synchronize(st), HCCN_SUCCESS, "hccn_stream_synchronize after refused calls",
                 "");
        CHECK(unchanged(b, abytes), "refused calls on a stream changed a buffer");
        check_rc(hccn_stream_destroy(st), HCCN_SUCCESS, "hccn_stream_destroy", "");
    }

    /* communicator construction (all checked locally, nothing may block) */
    memset(&zero_id, 0, sizeof zero_id);
    out = sentinel;
    expect_fail(hccn_comm_init_rank(NULL, n, &zero_id, 0), HCCN_ERROR_NULL_POINTER,
                "hccn_comm_init_rank(comm NULL)");
    expect_fail(hccn_comm_init_rank(&out, n, NULL, 0), HCCN_ERROR_NULL_POINTER,
                "hccn_comm_init_rank(id NULL)");
    expect_fail(hccn_comm_init_rank(&out, n, &zero_id, n), HCCN_ERROR_INVALID_ARGUMENT,
                "hccn_comm_init_rank(rank = nranks)");
    expect_fail(hccn_comm_init_rank(&out, 0, &zero_id, 0), ANY_ERROR, "hccn_comm_init_rank(nranks = 0)");
    CHECK(out == sentinel, "a failing hccn_comm_init_rank wrote *comm");
    ranks[0] = g_rank;
    ranks[1] = n;
    expect_fail(hccn_new_group(g_world, NULL, 1, &out), HCCN_ERROR_NULL_POINTER, "hccn_new_group(ranks NULL)");
    expect_fail(hccn_new_group(g_world, ranks, 1, NULL), HCCN_ERROR_NULL_POINTER, "hccn_new_group(group NULL)");
    expect_fail(hccn_new_group(NULL, ranks, 1, &out), HCCN_ERROR_NULL_POINTER, "hccn_new_group(comm NULL)");
    expect_fail(hccn_new_group(g_world, ranks, 2, &out), HCCN_ERROR_INVALID_ARGUMENT,
                "hccn_new_group(ranks = {self, size})");
    ranks[1] = g_rank;
    expect_fail(hccn_new_group(g_world, ranks, 2, &out), HCCN_ERROR_INVALID_ARGUMENT,
                "hccn_new_group(ranks = {self, self})");
    expect_fail(hccn_new_group(g_world, ranks, 0, &out), ANY_ERROR, "hccn_new_group(nranks = 0)");
    CHECK(out == sentinel, "a failing hccn_new_group wrote *group");
    expect_fail(hccn_comm_split(g_world, 0, 0, NULL), HCCN_ERROR_NULL_POINTER, "hccn_comm_split(out NULL)");
    expect_fail(hccn_comm_split(NULL, 0, 0, &out), HCCN_ERROR_NULL_POINTER, "hccn_comm_split(comm NULL)");
    CHECK(out == sentinel, "a failing hccn_comm_split wrote *out");
    still_works("bad communicator arguments");

    free(a);
    free(b);
}

/* Enqueues work on streams and checks the ordering, the queries, events and destroy. */
static void test_streams(void)
{
    enum { K = 6 };
    const uint64_t cnt = 50021;
    unsigned char *sb[K], *rb[K];
    double *exp = dalloc(cnt), *tol = dalloc(cnt);
    hccn_stream *s = NULL, *s2 = NULL;
    hccn_event *ev = NULL;
    hccn_result q;
    char ctx[96];
    int k;

    section("streams: several allreduces, event");
    if (!check_rc(hccn_stream_create(&s), HCCN_SUCCESS, "hccn_stream_create", "") ||
        !CHECK(s != NULL, "hccn_stream_create gave NULL")) {
        free(exp);
        free(tol);
        return;
    }
    for (k = 0; k < K; k++) {
        hccn_reduce_op op = k % 2 ? HCCN_MAX : HCCN_SUM;
        sb[k] = rbuf_new(cnt * 4);
        rb[k] = rbuf_new(cnt * 4);
        red_fill(sb[k], HCCN_FP32, op, g_rank, (uint64_t)k * 13, cnt);
    }
    for (k = 0; k < K; k++) {
        hccn_reduce_op op = k % 2 ? HCCN_MAX : HCCN_SUM;
        mkctx(ctx, sizeof ctx, HCCN_FP32, (int)op, cnt, NO_ROOT);
        check_rc(hccn_allreduce(sb[k], rb[k], cnt, HCCN_FP32, op, g_world, s), HCCN_SUCCESS,
                 "allreduce on a stream", ctx);
    }
    q = hccn_stream_query(s);
    CHECK(q == HCCN_SUCCESS || q == HCCN_IN_PROGRESS, "hccn_stream_query with queued work returned %s",
          rc_name(q));
    if (check_rc(hccn_event_create(&ev), HCCN_SUCCESS, "hccn_event_create", "")) {
        check_rc(hccn_event_record(ev, s), HCCN_SUCCESS, "hccn_event_record", "");
        check_rc(hccn_event_synchronize(ev), HCCN_SUCCESS, "hccn_event_synchronize", "");
        for (k = 0; k < K; k++) { /* everything recorded before the event is done */
            hccn_reduce_op op = k % 2 ? HCCN_MAX : HCCN_SUM;
            mkctx(ctx, sizeof ctx, HCCN_FP32, (int)op, cnt, NO_ROOT);
            red_expect(exp, tol, HCCN_FP32, op, g_size, (uint64_t)k * 13, cnt);
            check_array("allreduce on a stream, after hccn_event_synchronize", rb[k], HCCN_FP32, exp, tol,
                        cnt, ctx);
        }
        check_rc(hccn_event_query(ev), HCCN_SUCCESS, "hccn_event_query after hccn_event_synchronize", "");
    }
    check_rc(hccn_stream_synchronize(s), HCCN_SUCCESS, "hccn_stream_synchronize", "");
    check_rc(hccn_stream_query(s), HCCN_SUCCESS, "hccn_stream_query after hccn_stream_synchronize", "");

    section("streams: ordering");
    { /* each step reads the previous step's output: the queue must run in order */
        int64_t *x = (int64_t *)(void *)rb[0], *y = (int64_t *)(void *)rb[1];
        uint64_t j, m = cnt / 2, bad = 0;
        red_fill(x, HCCN_INT64, HCCN_SUM, g_rank, 0, m);
        check_rc(hccn_allreduce(x, y, m, HCCN_INT64, HCCN_SUM, g_world, s), HCCN_SUCCESS, "chain step 1", "");
        check_rc(hccn_allreduce(y, y, m, HCCN_INT64, HCCN_SUM, g_world, s), HCCN_SUCCESS, "chain step 2", "");
        check_rc(hccn_broadcast(y, m, HCCN_INT64, g_size - 1, g_world, s), HCCN_SUCCESS, "chain step 3", "");
        check_rc(hccn_allreduce(y, x, m, HCCN_INT64, HCCN_MAX, g_world, s), HCCN_SUCCESS, "chain step 4", "");
        if (check_rc(hccn_stream_synchronize(s), HCCN_SUCCESS, "hccn_stream_synchronize after chain", "")) {
            red_expect(exp, tol, HCCN_INT64, HCCN_SUM, g_size, 0, m);
            for (j = 0; j < m; j++)
                bad += (double)x[j] != exp[j] * g_size;
            CHECK(bad == 0, "stream ordering: %llu of %llu elements wrong after a 4-step chain (INT64)",
                  (ull)bad, (ull)m);
        }
    }

    section("streams: every collective");
    run_allreduce(HCCN_BF16, HCCN_AVG, 1023, 1, s);
    run_reduce(HCCN_INT16, HCCN_MIN, 1023, g_size - 1, 0, s);
    run_broadcast(HCCN_FP16, 1023, g_size / 2, s);
    run_allgather(HCCN_UINT32, 1023, 1, s);
    run_allgatherv(HCCN_INT8, 1, 5, s);
    run_reduce_scatter(HCCN_FP64, HCCN_PROD, 1023, 0, s);
    run_gather(HCCN_UINT64, 1023, 0, s);
    run_scatter(HCCN_UINT16, 1023, g_size - 1, 1, s);
    run_alltoall(HCCN_INT32, 1023, s);
    run_alltoallv(HCCN_FP32, 5, s);
    check_rc(hccn_barrier(g_world, s), HCCN_SUCCESS, "barrier on a stream", "");
    check_rc(hccn_stream_synchronize(s), HCCN_SUCCESS, "hccn_stream_synchronize after barrier", "");

    section("streams: enqueue returns at once");
    if (g_size >= 2) {
        /* rank 0 enqueues an allreduce the others join only 2 s later: the call must return at
         * once, and the queries must say IN_PROGRESS until then */
        mkctx(ctx, sizeof ctx, HCCN_FP32, HCCN_SUM, cnt, NO_ROOT);
        red_fill(sb[0], HCCN_FP32, HCCN_SUM, g_rank, 0, cnt);
        memset(rb[0], GARBAGE, cnt * 4);
        if (g_rank == 0) {
            double t0 = now_s(), took;
            hccn_result rc = hccn_allreduce(sb[0], rb[0], cnt, HCCN_FP32, HCCN_SUM, g_world, s);
            took = now_s() - t0;
            check_rc(rc, HCCN_SUCCESS, "allreduce on a stream", ctx);
            CHECK(took < 1.0, "allreduce on a stream took %.3f s to return while peers were away %s", took,
                  ctx);
            q = hccn_stream_query(s);
            CHECK(q == HCCN_IN_PROGRESS, "hccn_stream_query returned %s while peers were away, expected "
                  "HCCN_IN_PROGRESS", rc_name(q));
            if (ev) {
                check_rc(hccn_event_record(ev, s), HCCN_SUCCESS, "hccn_event_record (re-record)", "");
                q = hccn_event_query(ev);
                CHECK(q == HCCN_IN_PROGRESS, "hccn_event_query returned %s while peers were away, expected "
                      "HCCN_IN_PROGRESS", rc_name(q));
            }
            check_rc(hccn_stream_synchronize(s), HCCN_SUCCESS, "hccn_stream_synchronize", ctx);
            if (ev)
                check_rc(hccn_event_query(ev), HCCN_SUCCESS, "hccn_event_query after the stream finished", "");
        } else {
            sleep_ms(2000);
            check_rc(hccn_allreduce(sb[0], rb[0], cnt, HCCN_FP32, HCCN_SUM, g_world, NULL), HCCN_SUCCESS,
                     "allreduce", ctx);
        }
        red_expect(exp, tol, HCCN_FP32, HCCN_SUM, g_size, 0, cnt);
        check_array("allreduce enqueued before the peers joined", rb[0], HCCN_FP32, exp, tol, cnt, ctx);
    }

    section("streams: destroy waits for queued work");
    if (check_rc(hccn_stream_create(&s2), HCCN_SUCCESS, "hccn_stream_create", "")) {
        for (k = 0; k < K; k++) {
            red_fill(sb[k], HCCN_FP32, HCCN_SUM, g_rank, (uint64_t)k * 5, cnt);
            memset(rb[k], GARBAGE, cnt * 4);
            check_rc(hccn_allreduce(sb[k], rb[k], cnt, HCCN_FP32, HCCN_SUM, g_world, s2), HCCN_SUCCESS,
                     "allreduce on a stream", "");
        }
        check_rc(hccn_stream_destroy(s2), HCCN_SUCCESS, "hccn_stream_destroy with queued work", "");
        for (k = 0; k < K; k++) {
            mkctx(ctx, sizeof ctx, HCCN_FP32, HCCN_SUM, cnt, NO_ROOT);
            red_expect(exp, tol, HCCN_FP32, HCCN_SUM, g_size, (uint64_t)k * 5, cnt);
            check_array("allreduce queued before hccn_stream_destroy", rb[k], HCCN_FP32, exp, tol, cnt, ctx);
        }
    }

    section("streams: event on an idle stream");
    if (ev) {
        check_rc(hccn_event_record(ev, s), HCCN_SUCCESS, "hccn_event_record on an idle stream", "");
        check_rc(hccn_event_synchronize(ev), HCCN_SUCCESS, "hccn_event_synchronize on an idle stream", "");
        check_rc(hccn_event_query(ev), HCCN_SUCCESS, "hccn_event_query on an idle stream", "");
        check_rc(hccn_event_destroy(ev), HCCN_SUCCESS, "hccn_event_destroy", "");
    }
    check_rc(hccn_stream_destroy(s), HCCN_SUCCESS, "hccn_stream_destroy", "");
    for (k = 0; k < K; k++) {
        check_guard("stream buffers", rb[k], cnt * 4, "");
        free(sb[k]);
        free(rb[k]);
    }
    free(exp);
    free(tol);
}

/* On a sub-communicator of size n whose member i is world rank members[i]: checks rank, size,
 * an allgather of world ranks (the order) and an allreduce. */
static void check_subcomm(const char *name, hccn_comm *c, const uint32_t *members, uint32_t n, uint32_t me)
{
    uint32_t r = 0xDEADBEEFu, sz = 0xDEADBEEFu, i, j;
    int32_t mine[3], all[3 * MAX_RANKS], sum[3];
    check_rc(hccn_comm_rank(c, &r), HCCN_SUCCESS, "hccn_comm_rank", name);
    check_rc(hccn_comm_size(c, &sz), HCCN_SUCCESS, "hccn_comm_size", name);
    CHECK(r == me, "%s: hccn_comm_rank gave %u, expected %u", name, (unsigned)r, (unsigned)me);
    CHECK(sz == n, "%s: hccn_comm_size gave %u, expected %u", name, (unsigned)sz, (unsigned)n);
    for (j = 0; j < 3; j++)
        mine[j] = (int32_t)(g_rank * 10 + j);
    memset(all, 0, sizeof all);
    if (check_rc(hccn_allgather(mine, all, 3, HCCN_INT32, c, NULL), HCCN_SUCCESS, "allgather", name))
        for (i = 0; i < n; i++)
            CHECK(all[3 * i] == (int32_t)(members[i] * 10) && all[3 * i + 2] == (int32_t)(members[i] * 10 + 2),
                  "%s: allgather block %u came from world rank %d, expected %u", name, (unsigned)i,
                  (int)(all[3 * i] / 10), (unsigned)members[i]);
    if (check_rc(hccn_allreduce(mine, sum, 3, HCCN_INT32, HCCN_SUM, c, NULL), HCCN_SUCCESS, "allreduce",
                 name)) {
        int32_t want = 0;
        for (i = 0; i < n; i++)
            want += (int32_t)(members[i] * 10 + 1);
        CHECK(sum[1] == want, "%s: allreduce SUM gave %d, expected %d", name, (int)sum[1], (int)want);
    }
}

static void test_groups(void)
{
    uint32_t members[MAX_RANKS], n = 0, i;
    hccn_comm *g, *sentinel = (hccn_comm *)(void *)&sentinel;

    section("hccn_new_group (even ranks)");
    for (i = 0; i < g_size; i += 2)
        members[n++] = i;
    if (g_rank % 2 == 0) {
        g = sentinel;
        if (check_rc(hccn_new_group(g_world, members, n, &g), HCCN_SUCCESS, "hccn_new_group(even ranks)", "") &&
            CHECK(g != NULL && g != sentinel, "hccn_new_group gave no communicator")) {
            check_subcomm("new_group(even ranks)", g, members, n, g_rank / 2);
            check_rc(hccn_comm_destroy(g), HCCN_SUCCESS, "hccn_comm_destroy(group)", "");
        }
    }

    section("hccn_comm_split (color rank%2, key -rank)");
    n = 0;
    for (i = g_size; i-- > 0;) /* key -rank: the new order is by decreasing world rank */
        if (i % 2 == g_rank % 2)
            members[n++] = i;
    g = sentinel;
    if (check_rc(hccn_comm_split(g_world, (int32_t)(g_rank % 2), -(int32_t)g_rank, &g), HCCN_SUCCESS,
                 "hccn_comm_split(rank%2, -rank)", "") &&
        CHECK(g != NULL && g != sentinel, "hccn_comm_split gave no communicator")) {
        uint32_t me = 0;
        while (members[me] != g_rank)
            me++;
        check_subcomm("split(rank%2, -rank)", g, members, n, me);
        check_rc(hccn_comm_destroy(g), HCCN_SUCCESS, "hccn_comm_destroy(split)", "");
    }

    section("hccn_comm_split (last rank color -1)");
    n = 0;
    for (i = 0; i + 1 < g_size; i++)
        members[n++] = i;
    g = sentinel;
    if (check_rc(hccn_comm_split(g_world, g_rank + 1 == g_size ? -1 : 7, 0, &g), HCCN_SUCCESS,
                 "hccn_comm_split(color -1 on the last rank)", "")) {
        if (g_rank + 1 == g_size) {
            CHECK(g == NULL, "hccn_comm_split with color < 0 did not set *out = NULL");
        } else if (CHECK(g != NULL && g != sentinel, "hccn_comm_split gave no communicator")) {
            check_subcomm("split(7, 0) without the last rank", g, members, n, g_rank);
            check_rc(hccn_comm_destroy(g), HCCN_SUCCESS, "hccn_comm_destroy(split)", "");
        }
    }
    still_works("sub-communicators");
}

static void test_unique_id(void)
{
    hccn_unique_id id;
    hccn_comm *c = NULL;
    uint32_t members[MAX_RANKS], i, me = g_size - 1 - g_rank;
    section("hccn_get_unique_id + hccn_comm_init_rank");
    memset(&id, 0, sizeof id);
    if (g_rank == 0) {
        size_t k, nonzero = 0;
        check_rc(hccn_get_unique_id(&id), HCCN_SUCCESS, "hccn_get_unique_id", "");
        for (k = 0; k < sizeof id.internal; k++)
            nonzero += id.internal[k] != 0;
        CHECK(nonzero > 0, "hccn_get_unique_id gave 128 zero bytes");
    }
    if (!check_rc(hccn_broadcast(&id, sizeof id.internal, HCCN_UINT8, 0, g_world, NULL), HCCN_SUCCESS,
                  "broadcast of the unique id", ""))
        return;
    /* new ranks in reverse order of world ranks: the rank argument decides */
    for (i = 0; i < g_size; i++)
        members[i] = g_size - 1 - i;
    if (check_rc(hccn_comm_init_rank(&c, g_size, &id, me), HCCN_SUCCESS, "hccn_comm_init_rank", "") &&
        CHECK(c != NULL, "hccn_comm_init_rank gave NULL")) {
        check_subcomm("comm_init_rank(reversed)", c, members, g_size, me);
        check_rc(hccn_comm_destroy(c), HCCN_SUCCESS, "hccn_comm_destroy(init_rank comm)", "");
    }
    still_works("hccn_comm_init_rank");
}

int main(void)
{
    const char *env, *err;
    hccn_result rc;
    uint64_t mine[2], total[2];

    setvbuf(stdout, NULL, _IOLBF, 0);
    env = getenv("CONTRACT_TIMEOUT");
    if (env && atoi(env) > 0)
        g_timeout = (unsigned)atoi(env);
    env = getenv("CONTRACT_VERBOSE");
    g_verbose = env && env[0] && env[0] != '0';
    env = getenv("HCCN_RANK");
    g_rank = env ? (uint32_t)atoi(env) : 0; /* for messages until the communicator says */
    signal(SIGALRM, on_alarm);

    section("init");
    err = hccn_get_last_error();
    CHECK(err != NULL && err[0] == '\0', "hccn_get_last_error() before any call is \"%s\", expected \"\"",
          err ? err : "(NULL)");
    rc = hccn_init_from_env(&g_world);
    if (!check_rc(rc, HCCN_SUCCESS, "hccn_init_from_env", "") || !CHECK(g_world != NULL, "no communicator"))
        return 1;
    check_rc(hccn_comm_rank(g_world, &g_rank), HCCN_SUCCESS, "hccn_comm_rank", "");
    check_rc(hccn_comm_size(g_world, &g_size), HCCN_SUCCESS, "hccn_comm_size", "");
    env = getenv("HCCN_WORLD_SIZE");
    if (env)
        CHECK(g_size == (uint32_t)atoi(env), "hccn_comm_size gave %u, HCCN_WORLD_SIZE is %s", (unsigned)g_size,
              env);
    if (g_size < 1 || g_size > MAX_RANKS) {
        printf("FAIL rank %u: contract.c supports 1..%d ranks, not %u\n", (unsigned)g_rank, MAX_RANKS,
               (unsigned)g_size);
        return 1;
    }

    test_library();
    test_converters();
    test_allreduce();
    test_reduce();
    test_broadcast();
    test_allgather();
    test_reduce_scatter();
    test_gather_scatter();
    test_alltoall();
    test_sendrecv_barrier();
    test_bad_input();
    test_streams();
    test_groups();
    test_unique_id();

    section("summary");
    mine[0] = g_pass;
    mine[1] = g_fail;
    total[0] = total[1] = 0;
    rc = hccn_allreduce(mine, total, 2, HCCN_UINT64, HCCN_SUM, g_world, NULL);
    if (g_rank == 0) {
        if (rc != HCCN_SUCCESS)
            printf("contract: %llu checks passed on rank 0, %llu FAILED (no totals: %s)\n", (ull)g_pass,
                   (ull)g_fail, rc_name(rc));
        else if (total[1] == 0)
            printf("contract: %llu checks passed (%u ranks)\n", (ull)total[0], (unsigned)g_size);
        else
            printf("contract: %llu checks passed, %llu FAILED (%u ranks)\n", (ull)total[0], (ull)total[1],
                   (unsigned)g_size);
    }
    check_rc(hccn_comm_destroy(g_world), HCCN_SUCCESS, "hccn_comm_destroy(world)", "");
    alarm(0);
    fflush(stdout);
    return g_fail ? 1 : 0;
}
