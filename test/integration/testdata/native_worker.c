/* A native worker for the integration tests: logs through the host, calls
 * the gateway for "native.lookup" events, and answers one "native-out" event
 * whose data names the compiled-in VERSION, so a hot reload is visible. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "virtufin_fb.h"
#include "virtufin_worker_api.h"

#ifndef VERSION
#define VERSION "v1"
#endif
#ifndef OUT_TYPE
#define OUT_TYPE "native-out"
#endif

static int ends_with(vf_str s, const char* suffix) {
    size_t n = strlen(suffix);
    return s.ptr && s.len >= n && memcmp(s.ptr + s.len - n, suffix, n) == 0;
}

VIRTUFIN_EXPORT int32_t Process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                int32_t* out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) {
        *out = vf_response_error("malformed input event", out_len);
        return 1;
    }
    char line[256];
    snprintf(line, sizeof line, "native worker %s handling %.*s", VERSION, (int)ev.id.len, ev.id.ptr);
    host->log(host->engine_ptr, VIRTUFIN_LOG_INFO, line);
#ifdef CRASH_ON
    /* A worker bug: dereferences NULL on the event with this id. */
    if (ev.id.len == strlen(CRASH_ON) && memcmp(ev.id.ptr, CRASH_ON, ev.id.len) == 0) {
        volatile int* null = NULL;
        *null = 1;
    }
#endif
    usleep(2000); /* long enough for calls to overlap a reload */

    /* An event whose type ends with ".refuse": the worker's own error
     * answer (error_message, return code 0: published as an error
     * response, no retry); ".fail": a failure (return code 1: retried,
     * then dead-lettered). */
    if (ends_with(ev.type, ".refuse")) {
        *out = vf_response_error("no stock", out_len);
        return 0;
    }
    if (ends_with(ev.type, ".fail")) {
        *out = vf_response_error("it broke", out_len);
        return 1;
    }

    char* gw = NULL;
    if (ev.type.ptr && strcmp(ev.type.ptr, "native.lookup") == 0) {
        uint8_t* resp = NULL;
        int32_t resp_len = 0;
        int32_t code = host->gateway_call(host->engine_ptr, "pricing", "quote", ev.data.ptr, (int32_t)ev.data.len,
                                          &resp, &resp_len);
        if (code != VIRTUFIN_GATEWAY_OK) {
            if (resp) host->free_response(resp);
            *out = vf_response_error("gateway call failed", out_len);
            return 1;
        }
        gw = malloc((size_t)resp_len + 1);
        memcpy(gw, resp, (size_t)resp_len);
        gw[resp_len] = 0;
        host->free_response(resp);
    }
    size_t n = (gw ? strlen(gw) : 4) + ev.id.len + 128;
    char* data = malloc(n);
    int dl = snprintf(data, n, "{\"version\":\"%s\",\"id\":\"%.*s\",\"gateway\":%s}", VERSION, (int)ev.id.len, ev.id.ptr,
                      gw ? gw : "null");
    vf_out_event o = {0};
    o.type = OUT_TYPE;
    o.datacontenttype = "application/json";
    o.data = (const uint8_t*)data;
    o.data_len = (size_t)dl;
    *out = vf_response_build(&o, 1, NULL, out_len);
    free(data);
    free(gw);
    return *out ? 0 : 2;
}

VIRTUFIN_EXPORT void FreeResult(uint8_t* out) { free(out); }
