/*
 * c-greeter: an example WebAssembly worker in C. For each event it logs a
 * line and returns one "greeting" event (published to the topic
 * "greeting") whose data is {"hello": <the input's data>, "worker": <its
 * worker id>}, keeping the input's correlationid. An event without data
 * is answered with an error, "no data to greet" (error_message with return
 * code 0: the node publishes a worker.error event and a default
 * "<type>.error" response; no retry). Build (Debian: clang lld
 * wasi-libc libclang-rt-14-dev-wasm32):
 *
 *   make          # c-greeter.wasm
 *
 * and create the worker with MIME type application/wasm
 * (wmctl create c-greeter.wasm --topic names).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workmanager_wasm.h"

WM_PROCESS(in, in_len, out, out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) {
        *out = vf_response_error("malformed input event", out_len);
        return 1;
    }
    if (ev.data.ptr == NULL || ev.data.len == 0) {
        *out = vf_response_error("no data to greet", out_len);
        return 0;
    }
    const char* id = getenv("VIRTUFIN_WORKER_ID");
    if (id == NULL) id = "";
    /* {"hello":<data>,"worker":"<id>"}: the data is JSON already; the id is
     * [A-Za-z0-9-] (a worker id), no escaping needed. */
    size_t n = ev.data.len + strlen(id) + 32;
    char* data = malloc(n);
    if (data == NULL) return 2;
    int len = snprintf(data, n, "{\"hello\":%.*s,\"worker\":\"%s\"}", (int)ev.data.len, (const char*)ev.data.ptr, id);

    char line[160];
    snprintf(line, sizeof line, "greeting event %.*s", (int)(ev.id.len < 100 ? ev.id.len : 100), ev.id.ptr ? ev.id.ptr : "");
    wm_log(WM_LOG_INFO, line);

    vf_out_event o = {0};
    vf_kv corr;
    vf_str c = vf_event_find_extension(&ev, "correlationid");
    o.type = "greeting";
    o.subject = ev.id.ptr;
    o.datacontenttype = "application/json";
    o.data = (const uint8_t*)data;
    o.data_len = (size_t)len;
    if (c.ptr) {
        corr.key = "correlationid";
        corr.value = c.ptr;
        o.extensions = &corr;
        o.n_extensions = 1;
    }
    *out = vf_response_build(&o, 1, NULL, out_len);
    free(data);
    return *out == NULL ? 3 : 0;
}
