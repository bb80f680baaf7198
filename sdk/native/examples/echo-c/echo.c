/*
 * echo - a worked example of a WorkManager native worker in plain C.
 *
 * For every input event it
 *   - logs a line through the host (host->log),
 *   - for events of type "example.lookup", calls a backend service through
 *     the node's gateway (host->gateway_call) with the event's data as the
 *     JSON request and returns the response as the output's data,
 *   - otherwise returns one "example.echoed" event whose data is the input's
 *     data, keeping the input's correlationid.
 *
 * Build and package: make package   (see Makefile and ../../README.md)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "virtufin_fb.h"
#include "virtufin_worker_api.h"

static int32_t fail(uint8_t** out, int32_t* out_len, const char* msg) {
    *out = vf_response_error(msg, out_len);
    return 1; /* non-zero: the host reports "worker failed" with this code and msg */
}

static int32_t lookup(const VirtufinHost* host, const vf_event* ev, uint8_t** out, int32_t* out_len) {
    uint8_t* resp = NULL;
    int32_t resp_len = 0;
    int32_t code = host->gateway_call(host->engine_ptr, "inventory", "v1/lookup", ev->data.ptr,
                                      (int32_t)ev->data.len, &resp, &resp_len);
    if (code != VIRTUFIN_GATEWAY_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "inventory lookup failed (code %d): %.*s", code, resp ? (int)resp_len : 0,
                 resp ? (const char*)resp : "");
        if (resp) host->free_response(resp);
        return fail(out, out_len, msg);
    }
    vf_out_event o = {0};
    o.type = "example.lookup.result";
    o.datacontenttype = "application/json";
    o.data = resp;
    o.data_len = (size_t)resp_len;
    *out = vf_response_build(&o, 1, NULL, out_len); /* copies resp */
    if (resp) host->free_response(resp);
    return *out ? 0 : 2;
}

VIRTUFIN_EXPORT int32_t Process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                int32_t* out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) return fail(out, out_len, "malformed input event");

    char line[256];
    snprintf(line, sizeof line, "worker %s got event %.*s of type %.*s", host->worker_id, (int)ev.id.len,
             ev.id.ptr ? ev.id.ptr : "", (int)ev.type.len, ev.type.ptr ? ev.type.ptr : "");
    host->log(host->engine_ptr, VIRTUFIN_LOG_INFO, line);

    if (ev.type.ptr && strcmp(ev.type.ptr, "example.lookup") == 0) return lookup(host, &ev, out, out_len);

    /* Echo. Output id and source may be left out: WorkManager fills them
     * in. The correlationid extension is copied explicitly here. */
    vf_kv ext[1];
    vf_out_event o = {0};
    o.type = "example.echoed";
    o.datacontenttype = ev.datacontenttype.ptr;
    o.data = ev.data.ptr;
    o.data_len = ev.data.len;
    vf_str corr = vf_event_find_extension(&ev, "correlationid");
    if (corr.ptr) {
        ext[0].key = "correlationid";
        ext[0].value = corr.ptr;
        o.extensions = ext;
        o.n_extensions = 1;
    }
    *out = vf_response_build(&o, 1, NULL, out_len);
    return *out ? 0 : 2;
}

VIRTUFIN_EXPORT void FreeResult(uint8_t* out) { free(out); }
