/*
 * Test fixture worker for the native engine's tests. The tests compile it
 * with gcc into shared libraries (one per -D variant):
 *
 *   (default)       Echo: one "conformance.echo" event whose data is
 *                   {"id": .., "data": .., "correlationid": ..}
 *   -DMODE_MULTI    two events, "conformance.a" then "conformance.b"
 *   -DMODE_NONE     no event
 *   -DMODE_RAISE    fails with "boom" on "conformance.raise", else Echo
 *   -DMODE_HANG     sleeps HANG_MS (1.2 s) on "conformance.hang", else Echo
 *   -DNO_FREE       does not export FreeResult (invalid library)
 *   -DPROCESS_NAME=x / -DFREE_NAME=y   other export names
 *   -DCTOR_WRITE='"path"'   a constructor that writes "ran" to path at load
 *   -DCTOR_KILL     a constructor that SIGKILLs its parent, then itself
 *   -DCTOR_REQUIRE_ID='"id"'  a constructor that exits (7) unless
 *                   VIRTUFIN_WORKER_ID is id when the library loads
 *   -DCTOR_SOCKETS  a constructor that writes "LEAKED" to every socket among
 *                   its descriptors 3..1023 (the node's, if any reached it)
 *
 * Every variant also reacts to the "test.*" event types below (among them
 * test.forged, test.bigout, test.manyout, test.bigdata, test.manyext,
 * test.forkhang, test.setsidhang, test.exitsoon,
 * test.longline and test.sleep/test.sleepstats for the engine's robustness
 * tests; test.gateway waits for the file named by its "gwwaitfile"
 * extension before it calls).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "virtufin_fb.h"
#include "virtufin_worker_api.h"

#ifndef PROCESS_NAME
#define PROCESS_NAME Process
#endif
#ifndef FREE_NAME
#define FREE_NAME FreeResult
#endif
#ifndef HANG_MS
#define HANG_MS 1200
#endif

static int64_t n_allocs, n_frees; /* responses handed out / freed */
static int hang_free;                /* test.hangfree: FreeResult waits until test.unhang */
static int64_t n_sleeping, max_sleeping; /* test.sleep calls in progress, most at once */

#if defined(CTOR_WRITE)
__attribute__((constructor)) static void ctor_write(void) {
    FILE *f = fopen(CTOR_WRITE, "w");
    if (f) {
        fputs("ran", f);
        fclose(f);
    }
}
#endif
#if defined(CTOR_REQUIRE_ID)
#include <unistd.h>
__attribute__((constructor)) static void ctor_require_id(void) {
    const char* v = getenv("VIRTUFIN_WORKER_ID");
    if (!v || strcmp(v, CTOR_REQUIRE_ID) != 0)
        _exit(7);
}
#endif
#if defined(CTOR_KILL)
#include <unistd.h>
__attribute__((constructor)) static void ctor_kill(void) {
    kill(getppid(), SIGKILL);
    kill(getpid(), SIGKILL);
}
#endif
#if defined(CTOR_SOCKETS)
#include <sys/stat.h>
__attribute__((constructor)) static void ctor_sockets(void) {
    struct stat st;
    for (int fd = 3; fd < 1024; fd++) {
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
            ssize_t n = write(fd, "LEAKED", 6);
            (void)n;
        }
    }
}
#endif

/* ---- a growable string ---------------------------------------------- */
typedef struct {
    char* b;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf* s, const char* p, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        s->b = realloc(s->b, cap);
        s->cap = cap;
    }
    memcpy(s->b + s->len, p, n);
    s->len += n;
    s->b[s->len] = 0;
}
static void sb_str(sbuf* s, const char* p) { sb_put(s, p, strlen(p)); }

static void sb_json_string(sbuf* s, const char* p, size_t n) {
    sb_put(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(s, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(s, esc, 6);
        } else {
            sb_put(s, (const char*)&p[i], 1);
        }
    }
    sb_put(s, "\"", 1);
}

static void sb_json_or_null(sbuf* s, vf_str v) {
    if (v.ptr)
        sb_json_string(s, v.ptr, v.len);
    else
        sb_str(s, "null");
}

/* data_number parses the event's data as a decimal number (def when it
 * has none). The data is not NUL-terminated: strtol straight on it reads
 * on into whatever bytes follow it in the request buffer. */
static long data_number(const vf_event* ev, long def) {
    if (ev->data.ptr == NULL || ev->data.len == 0) return def;
    char buf[32];
    size_t n = ev->data.len < sizeof buf - 1 ? ev->data.len : sizeof buf - 1;
    memcpy(buf, ev->data.ptr, n);
    buf[n] = 0;
    return strtol(buf, NULL, 10);
}

static int is(vf_str s, const char* want) { return s.ptr && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0; }

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- responses ------------------------------------------------------- */
static int32_t respond(uint8_t** out, int32_t* out_len, const vf_out_event* evs, size_t n, const char* err) {
    *out = vf_response_build(evs, n, err, out_len);
    if (*out == NULL) return 99;
    __atomic_add_fetch(&n_allocs, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static int32_t respond_json(uint8_t** out, int32_t* out_len, const char* type, sbuf* data) {
    vf_out_event ev = {0};
    ev.type = type;
    ev.datacontenttype = "application/json";
    ev.data = (const uint8_t*)data->b;
    ev.data_len = data->len;
    int32_t rc = respond(out, out_len, &ev, 1, NULL);
    free(data->b);
    return rc;
}

static int32_t echo(const vf_event* ev, uint8_t** out, int32_t* out_len) {
    sbuf s = {0};
    sb_str(&s, "{\"id\":");
    sb_json_or_null(&s, ev->id);
    sb_str(&s, ",\"data\":");
    if (ev->data.ptr && ev->data.len > 0)
        sb_put(&s, (const char*)ev->data.ptr, ev->data.len);
    else
        sb_str(&s, "null");
    sb_str(&s, ",\"correlationid\":");
    sb_json_or_null(&s, vf_event_find_extension(ev, "correlationid"));
    sb_str(&s, "}");
    return respond_json(out, out_len, "conformance.echo", &s);
}

/* Copies every attribute of the input into the output. */
static int32_t fields(const vf_event* ev, uint8_t** out, int32_t* out_len) {
    vf_kv kvs[32];
    size_t n = 0;
    for (uint32_t i = 0; i < ev->n_extensions && n < 31; i++) {
        vf_str k, v;
        if (vf_event_extension(ev, i, &k, &v) == 0) {
            kvs[n].key = k.ptr;
            kvs[n].value = v.ptr;
            n++;
        }
    }
    kvs[n].key = "fixture";
    kvs[n].value = "yes";
    n++;
    vf_out_event o = {0};
    o.id = "out-1";
    o.source = "/fixture";
    o.type = "test.fields.result";
    o.subject = ev->subject.ptr;
    o.time = ev->time.ptr;
    o.datacontenttype = ev->datacontenttype.ptr;
    o.dataschema = ev->dataschema.ptr;
    o.data = ev->data.ptr;
    o.data_len = ev->data.len;
    o.extensions = kvs;
    o.n_extensions = n;
    return respond(out, out_len, &o, 1, NULL);
}

static int32_t identity(const VirtufinHost* host, uint8_t** out, int32_t* out_len) {
    char tmp[64];
    const char* env = getenv("VIRTUFIN_WORKER_ID");
    sbuf s = {0};
    sb_str(&s, "{\"worker_id\":");
    sb_json_string(&s, host->worker_id, strlen(host->worker_id));
    sb_str(&s, ",\"group\":");
    sb_json_string(&s, host->worker_group, strlen(host->worker_group));
    sb_str(&s, ",\"topic\":");
    sb_json_string(&s, host->worker_topic, strlen(host->worker_topic));
    sb_str(&s, ",\"env_worker_id\":");
    if (env)
        sb_json_string(&s, env, strlen(env));
    else
        sb_str(&s, "null");
    snprintf(tmp, sizeof tmp, ",\"abi\":%d,\"size\":%d}", host->abi_version, host->struct_size);
    sb_str(&s, tmp);
    return respond_json(out, out_len, "test.identity.result", &s);
}

static int32_t gateway(const VirtufinHost* host, const vf_event* ev, uint8_t** out, int32_t* out_len) {
    uint8_t* resp = NULL;
    int32_t resp_len = 0;
    vf_str method = vf_event_find_extension(ev, "gwmethod");
    /* "gwwaitfile": wait until that file exists before calling (a call the
     * engine may meanwhile have abandoned at its timeout). */
    vf_str wait = vf_event_find_extension(ev, "gwwaitfile");
    if (wait.ptr) {
        char path[512];
        size_t n = wait.len < sizeof path - 1 ? wait.len : sizeof path - 1;
        memcpy(path, wait.ptr, n);
        path[n] = 0;
        while (access(path, F_OK) != 0) sleep_ms(5);
    }
    int32_t code = host->gateway_call(host->engine_ptr, "svc", method.ptr ? method.ptr : "do/it", ev->data.ptr,
                                      (int32_t)ev->data.len, &resp, &resp_len);
    sbuf s = {0};
    if (code != VIRTUFIN_GATEWAY_OK) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "gateway code %d: ", code);
        sb_str(&s, tmp);
        if (resp) sb_put(&s, (const char*)resp, (size_t)resp_len);
        if (resp) host->free_response(resp);
        int32_t rc = respond(out, out_len, NULL, 0, s.b);
        free(s.b);
        return rc;
    }
    if (resp) {
        sb_put(&s, (const char*)resp, (size_t)resp_len);
        host->free_response(resp);
    } else {
        sb_str(&s, "null");
    }
    return respond_json(out, out_len, "test.gateway.result", &s);
}

static void* exit_soon(void* arg) {
    (void)arg;
    sleep_ms(200);
    _exit(0);
    return NULL;
}

VIRTUFIN_EXPORT int32_t PROCESS_NAME(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                     int32_t* out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) return respond(out, out_len, NULL, 0, "fixture: malformed input");

    if (is(ev.type, "test.log")) {
        char msg[64];
        for (int level = 0; level <= 4; level++) {
            snprintf(msg, sizeof msg, "log-%d from %s", level, host->worker_id);
            host->log(host->engine_ptr, level, msg);
        }
        return 0;
    }
    if (is(ev.type, "test.gateway")) return gateway(host, &ev, out, out_len);
    if (is(ev.type, "test.identity")) return identity(host, out, out_len);
    if (is(ev.type, "test.fields")) return fields(&ev, out, out_len);
    if (is(ev.type, "test.stats")) {
        char tmp[96];
        sbuf s = {0};
        snprintf(tmp, sizeof tmp, "{\"allocs\":%lld,\"frees\":%lld}",
                 (long long)__atomic_load_n(&n_allocs, __ATOMIC_SEQ_CST),
                 (long long)__atomic_load_n(&n_frees, __ATOMIC_SEQ_CST));
        sb_str(&s, tmp);
        return respond_json(out, out_len, "test.stats.result", &s);
    }
    if (is(ev.type, "test.crash")) {
        fprintf(stderr, "fixture: crashing on purpose\n");
        fflush(stderr);
        raise(SIGSEGV);
        return 0;
    }
    if (is(ev.type, "test.badresponse")) {
        *out = malloc(16);
        memset(*out, 0xff, 16);
        *out_len = 16;
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (is(ev.type, "test.badlen")) {
        *out = malloc(16);
        *out_len = 0;
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (is(ev.type, "test.forged")) {
        /* Issue 34: 48 bytes whose result_events vector claims ~4 billion
         * elements. */
        static const uint8_t forged[48] = {
            0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x08, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x04, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
            0xf0, 0xff, 0xff, 0xff};
        *out = malloc(sizeof forged);
        memcpy(*out, forged, sizeof forged);
        *out_len = sizeof forged;
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (is(ev.type, "test.bigout")) {
        /* One event with 2 MiB of data. */
        size_t n = 2u << 20;
        uint8_t* data = malloc(n);
        memset(data, 'x', n);
        vf_out_event o = {0};
        o.type = "test.bigout.result";
        o.data = data;
        o.data_len = n;
        int32_t rc = respond(out, out_len, &o, 1, NULL);
        free(data);
        return rc;
    }
    if (is(ev.type, "test.manyout") || is(ev.type, "test.bigdata") || is(ev.type, "test.manyext")) {
        /* Issue 42 item 4 (the reply's cost to the node): the data is a
         * count n. test.manyout: n events of type "a" and nothing else;
         * test.bigdata: one event with n bytes of data; test.manyext: one
         * event with n extensions ("k0".."k<n-1>" = "v"). */
        long n = data_number(&ev, 0);
        if (n < 0) n = 0;
        int32_t rc;
        if (is(ev.type, "test.manyout")) {
            vf_out_event* o = calloc((size_t)n + 1, sizeof *o);
            for (long i = 0; i < n; i++) o[i].type = "a";
            rc = respond(out, out_len, o, (size_t)n, NULL);
            free(o);
        } else if (is(ev.type, "test.bigdata")) {
            uint8_t* data = malloc((size_t)n + 1);
            memset(data, 'x', (size_t)n);
            vf_out_event o = {0};
            o.type = "test.bigdata.result";
            o.data = data;
            o.data_len = (size_t)n;
            rc = respond(out, out_len, &o, 1, NULL);
            free(data);
        } else {
            vf_kv* kvs = calloc((size_t)n + 1, sizeof *kvs);
            char* keys = malloc((size_t)n * 24 + 1);
            for (long i = 0; i < n; i++) {
                snprintf(keys + i * 24, 24, "k%ld", i);
                kvs[i].key = keys + i * 24;
                kvs[i].value = "v";
            }
            vf_out_event o = {0};
            o.type = "test.manyext.result";
            o.extensions = kvs;
            o.n_extensions = (size_t)n;
            rc = respond(out, out_len, &o, 1, NULL);
            free(keys);
            free(kvs);
        }
        return rc;
    }
    if (is(ev.type, "test.forkhang")) {
        /* A child that keeps the host's pipes open, then a hang. */
        if (fork() == 0) {
            sleep_ms(20000);
            _exit(0);
        }
        sleep_ms(20000);
        return echo(&ev, out, out_len);
    }
    if (is(ev.type, "test.setsidhang")) {
        /* Issue 42 item 8: a child that leaves the host's process group
         * and session (setsid) keeps the host's pipes and output open for
         * 20 s, then a hang. The data (a JSON string) names a file that
         * gets the child's pid. */
        pid_t child = fork();
        if (child == 0) {
            setsid();
            sleep_ms(20000);
            _exit(0);
        }
        if (child > 0 && ev.data.ptr != NULL && ev.data.len > 2 && ev.data.len < 4096) {
            char path[4096];
            memcpy(path, ev.data.ptr + 1, ev.data.len - 2); /* without the quotes */
            path[ev.data.len - 2] = 0;
            FILE* f = fopen(path, "w");
            if (f) {
                fprintf(f, "%d\n", (int)child);
                fclose(f);
            }
        }
        sleep_ms(20000);
        return echo(&ev, out, out_len);
    }
    if (is(ev.type, "test.exitsoon")) {
        /* Answers, then the process exits while idle. */
        pthread_t th;
        pthread_create(&th, NULL, exit_soon, NULL);
        pthread_detach(th);
        return echo(&ev, out, out_len);
    }
    if (is(ev.type, "test.longline")) {
        /* A 100 KiB output line, then a crash whose report must still be
         * seen. */
        for (int i = 0; i < 100 << 10; i++) fputc('y', stdout);
        fputc('\n', stdout);
        fflush(stdout);
        fprintf(stderr, "fixture: crashing after a long line\n");
        fflush(stderr);
        raise(SIGSEGV);
        return 0;
    }
    if (is(ev.type, "test.hangfree")) { /* this response's FreeResult, and any after it, wait for test.unhang */
        __atomic_store_n(&hang_free, 1, __ATOMIC_SEQ_CST);
        return echo(&ev, out, out_len);
    }
    if (is(ev.type, "test.unhang")) {
        __atomic_store_n(&hang_free, 0, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (is(ev.type, "test.code")) return 7;
    if (is(ev.type, "test.codemsg")) {
        respond(out, out_len, NULL, 0, "it went wrong");
        return 5;
    }
    if (is(ev.type, "test.answer")) return respond(out, out_len, NULL, 0, "no stock");
    if (is(ev.type, "test.answerwith")) {
        vf_out_event o = {0};
        o.type = "test.refused";
        return respond(out, out_len, &o, 1, "no stock");
    }
    if (is(ev.type, "test.notype")) {
        vf_out_event o = {0};
        o.id = "x";
        return respond(out, out_len, &o, 1, NULL);
    }
    if (is(ev.type, "test.multi3")) {
        vf_out_event o[3] = {{0}};
        o[0].type = "m.1";
        o[1].type = "m.2";
        o[2].type = "m.3";
        return respond(out, out_len, o, 3, NULL);
    }
    if (is(ev.type, "test.sleep")) {
        long ms = data_number(&ev, 100);
        int64_t n = __atomic_add_fetch(&n_sleeping, 1, __ATOMIC_SEQ_CST);
        for (int64_t m = __atomic_load_n(&max_sleeping, __ATOMIC_SEQ_CST);
             n > m && !__atomic_compare_exchange_n(&max_sleeping, &m, n, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);) {
        }
        sleep_ms(ms);
        __atomic_sub_fetch(&n_sleeping, 1, __ATOMIC_SEQ_CST);
        return echo(&ev, out, out_len);
    }
    if (is(ev.type, "test.sleepstats")) {
        /* How many test.sleep calls are in native code now, and the most
         * there were at once. */
        char tmp[96];
        sbuf s = {0};
        snprintf(tmp, sizeof tmp, "{\"sleeping\":%lld,\"max\":%lld}",
                 (long long)__atomic_load_n(&n_sleeping, __ATOMIC_SEQ_CST),
                 (long long)__atomic_load_n(&max_sleeping, __ATOMIC_SEQ_CST));
        sb_str(&s, tmp);
        return respond_json(out, out_len, "test.sleepstats.result", &s);
    }

#if defined(MODE_MULTI)
    vf_out_event o[2] = {{0}};
    o[0].type = "conformance.a";
    o[0].datacontenttype = "application/json";
    o[0].data = (const uint8_t*)"{\"n\":1}";
    o[0].data_len = 7;
    o[1].type = "conformance.b";
    return respond(out, out_len, o, 2, NULL);
#elif defined(MODE_NONE)
    return 0;
#else
#if defined(MODE_RAISE)
    if (is(ev.type, "conformance.raise")) {
        respond(out, out_len, NULL, 0, "boom");
        return 3;
    }
#endif
#if defined(MODE_HANG)
    if (is(ev.type, "conformance.hang")) {
        for (int i = 0; i < HANG_MS / 10; i++) sleep_ms(10);
    }
#endif
    return echo(&ev, out, out_len);
#endif
}

#ifndef NO_FREE
VIRTUFIN_EXPORT void FREE_NAME(uint8_t* out) {
    while (__atomic_load_n(&hang_free, __ATOMIC_SEQ_CST)) sleep_ms(5);
    __atomic_add_fetch(&n_frees, 1, __ATOMIC_SEQ_CST);
    free(out);
}
#endif

/* ---- benchmark pair: a trivial Process returning a prebuilt response -- */
static uint8_t* bench_resp;
static int32_t bench_len;

__attribute__((constructor)) static void bench_init(void) {
    static uint8_t data[1024];
    memset(data, 'x', sizeof data);
    data[0] = '"';
    data[sizeof data - 1] = '"';
    vf_out_event o = {0};
    o.type = "bench.echo";
    o.datacontenttype = "application/json";
    o.data = data;
    o.data_len = sizeof data;
    bench_resp = vf_response_build(&o, 1, NULL, &bench_len);
}

VIRTUFIN_EXPORT int32_t BenchProcess(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                     int32_t* out_len) {
    (void)host;
    (void)in;
    (void)in_len;
    *out = bench_resp;
    *out_len = bench_len;
    return 0;
}

VIRTUFIN_EXPORT void BenchFree(uint8_t* out) { (void)out; }

/* A C-side round trip of the host's log callback, for the callback cost. */
VIRTUFIN_EXPORT int32_t BenchLog(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                 int32_t* out_len) {
    (void)in;
    (void)in_len;
    (void)out;
    (void)out_len;
    host->log(host->engine_ptr, VIRTUFIN_LOG_TRACE, "x");
    return 0;
}
