/*
 * Test fixture worker for the wasm engine's tests, built with clang for
 * wasm32-wasi (a reactor) by the tests, one module per -D variant:
 *
 *   (default)     Echo: one "conformance.echo" event whose data is
 *                 {"id": .., "data": .., "correlationid": ..}
 *   -DMODE_MULTI  two events, "conformance.a" then "conformance.b"
 *   -DMODE_NONE   no event
 *   -DMODE_RAISE  fails with "boom" on "conformance.raise", else Echo
 *   -DMODE_HANG   loops for ever on "conformance.hang", else Echo
 *   -DMODE_BENCH  one "bench.response" event with the input's data
 *
 * Every variant also reacts to "test.*" types: test.log, test.gateway,
 * test.identity (the WASI environment), test.fence (the fencingtoken
 * extension), test.exit (exit(3)), test.unreachable, test.oob,
 * test.oom (mallocs 1 MiB blocks until malloc fails), test.stderr (writes
 * to stderr, then traps), test.count (a counter kept across calls),
 * test.clock (reads the monotonic and the wall clock).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workmanager_wasm.h"

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

static void sb_json_or_null(sbuf* s, const char* p, size_t n) {
    if (p)
        sb_json_string(s, p, n);
    else
        sb_str(s, "null");
}

static int is(vf_str s, const char* want) { return s.ptr && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0; }

static int32_t respond(uint8_t** out, int32_t* out_len, const vf_out_event* evs, size_t n, const char* err) {
    *out = vf_response_build(evs, n, err, out_len);
    return *out == NULL ? 99 : 0;
}

static int32_t respond_json(uint8_t** out, int32_t* out_len, const char* type, sbuf* data, const vf_event* in) {
    vf_out_event ev = {0};
    vf_kv kv;
    vf_str corr = vf_event_find_extension(in, "correlationid");
    ev.type = type;
    ev.datacontenttype = "application/json";
    ev.data = (const uint8_t*)data->b;
    ev.data_len = data->len;
    if (corr.ptr) {
        kv.key = "correlationid";
        kv.value = corr.ptr;
        ev.extensions = &kv;
        ev.n_extensions = 1;
    }
    int32_t rc = respond(out, out_len, &ev, 1, NULL);
    free(data->b);
    return rc;
}

__attribute__((unused)) static int32_t echo(const vf_event* ev, uint8_t** out, int32_t* out_len) {
    sbuf s = {0};
    vf_str corr = vf_event_find_extension(ev, "correlationid");
    sb_str(&s, "{\"id\":");
    sb_json_or_null(&s, ev->id.ptr, ev->id.len);
    sb_str(&s, ",\"data\":");
    if (ev->data.ptr && ev->data.len > 0)
        sb_put(&s, (const char*)ev->data.ptr, ev->data.len);
    else
        sb_str(&s, "null");
    sb_str(&s, ",\"correlationid\":");
    sb_json_or_null(&s, corr.ptr, corr.len);
    sb_str(&s, "}");
    return respond_json(out, out_len, "conformance.echo", &s, ev);
}

static int32_t env_json(const vf_event* ev, uint8_t** out, int32_t* out_len) {
    const char* names[] = {"VIRTUFIN_WORKER_ID", "VIRTUFIN_WORKER_GROUP", "VIRTUFIN_WORKER_TOPIC", "HOME", "PATH"};
    sbuf s = {0};
    sb_str(&s, "{");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char* v = getenv(names[i]);
        if (i) sb_str(&s, ",");
        sb_json_string(&s, names[i], strlen(names[i]));
        sb_str(&s, ":");
        sb_json_or_null(&s, v, v ? strlen(v) : 0);
    }
    FILE* f = fopen("/etc/passwd", "r");
    sb_str(&s, f ? ",\"passwd\":true" : ",\"passwd\":false");
    if (f) fclose(f);
    /* Descriptors beyond stdin/stdout/stderr: none (the node's are not
     * reachable; WASI descriptors are the module's own table). */
    int open_fds = 0;
    for (int fd = 3; fd < 64; fd++)
        if (write(fd, "x", 0) >= 0) open_fds++;
    char tmp[32];
    snprintf(tmp, sizeof tmp, ",\"fds\":%d", open_fds);
    sb_str(&s, tmp);
    sb_str(&s, "}");
    return respond_json(out, out_len, "test.identity.result", &s, ev);
}

static int32_t gateway(const vf_event* ev, uint8_t** out, int32_t* out_len) {
    uint8_t* resp = NULL;
    int32_t resp_len = 0;
    vf_str method = vf_event_find_extension(ev, "gwmethod");
    int32_t code = wm_gateway_call("svc", method.ptr ? method.ptr : "do/it", ev->data.ptr, (int32_t)ev->data.len,
                                   &resp, &resp_len);
    sbuf s = {0};
    if (code != WM_GATEWAY_OK) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "gateway code %d: ", code);
        sb_str(&s, tmp);
        if (resp) sb_put(&s, (const char*)resp, (size_t)resp_len);
        free(resp);
        int32_t rc = respond(out, out_len, NULL, 0, s.b);
        free(s.b);
        return rc;
    }
    if (resp)
        sb_put(&s, (const char*)resp, (size_t)resp_len);
    else
        sb_str(&s, "null");
    free(resp);
    return respond_json(out, out_len, "test.gateway.result", &s, ev);
}

static volatile int64_t counter;
static volatile uint8_t* volatile sink;

WM_PROCESS(in, in_len, out, out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) return respond(out, out_len, NULL, 0, "fixture: malformed input");

    if (is(ev.type, "test.log")) {
        char msg[64];
        for (int level = 0; level <= 4; level++) {
            snprintf(msg, sizeof msg, "log-%d", level);
            wm_log(level, msg);
        }
        printf("printed to stdout\n");
        fflush(stdout);
        return 0;
    }
    if (is(ev.type, "test.gateway")) return gateway(&ev, out, out_len);
    if (is(ev.type, "test.identity")) return env_json(&ev, out, out_len);
    if (is(ev.type, "test.fence")) {
        vf_str tok = vf_event_find_extension(&ev, "fencingtoken");
        sbuf s = {0};
        sb_json_or_null(&s, tok.ptr, tok.len);
        return respond_json(out, out_len, "test.fence.result", &s, &ev);
    }
    if (is(ev.type, "test.count")) {
        char tmp[32];
        sbuf s = {0};
        snprintf(tmp, sizeof tmp, "%lld", (long long)++counter);
        sb_str(&s, tmp);
        return respond_json(out, out_len, "test.count.result", &s, &ev);
    }
    if (is(ev.type, "test.clock")) {
        struct timespec mono, wall;
        char tmp[96];
        sbuf s = {0};
        clock_gettime(CLOCK_MONOTONIC, &mono);
        clock_gettime(CLOCK_REALTIME, &wall);
        snprintf(tmp, sizeof tmp, "{\"mono\":%lld,\"wall\":%lld}", (long long)mono.tv_sec, (long long)wall.tv_sec);
        sb_str(&s, tmp);
        return respond_json(out, out_len, "test.clock.result", &s, &ev);
    }
    if (is(ev.type, "test.exit")) exit(3);
    if (is(ev.type, "test.unreachable")) __builtin_trap();
    if (is(ev.type, "test.oob")) {
        volatile uint8_t* p = (volatile uint8_t*)(uintptr_t)0xfffffff0u;
        return (int32_t)*p;
    }
    if (is(ev.type, "test.stderr")) {
        fprintf(stderr, "fixture: about to trap\n");
        fflush(stderr);
        __builtin_trap();
    }
    if (is(ev.type, "test.oom")) {
        size_t total = 0;
        for (;;) {
            volatile uint8_t* p = malloc(1 << 20);
            if (p == NULL) break;
            p[0] = 1; /* used: the allocation is not optimised away */
            sink = p;
            total += 1 << 20;
        }
        char msg[96];
        snprintf(msg, sizeof msg, "out of memory after %zu MiB", total >> 20);
        return respond(out, out_len, NULL, 0, msg);
    }
#if defined(MODE_BENCH)
    vf_out_event o = {0};
    o.type = "bench.response";
    o.datacontenttype = "application/json";
    o.data = ev.data.ptr;
    o.data_len = ev.data.len;
    return respond(out, out_len, &o, 1, NULL);
#elif defined(MODE_MULTI)
    vf_out_event evs[2] = {{0}, {0}};
    evs[0].type = "conformance.a";
    evs[1].type = "conformance.b";
    return respond(out, out_len, evs, 2, NULL);
#elif defined(MODE_NONE)
    return 0;
#else
#if defined(MODE_RAISE)
    if (is(ev.type, "conformance.raise")) return respond(out, out_len, NULL, 0, "boom");
#endif
#if defined(MODE_HANG)
    if (is(ev.type, "conformance.hang"))
        for (;;) counter++;
#endif
    return echo(&ev, out, out_len);
#endif
}
