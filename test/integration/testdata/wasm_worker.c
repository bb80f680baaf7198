/* A WebAssembly worker for the integration tests (C, clang wasm32-wasi,
 * sdk/wasm): answers each event with one OUT_TYPE event whose data says
 * what the worker saw — the input's id, its fencingtoken extension (set
 * for a grouped worker) and the worker's group from its environment —,
 * keeping the input's correlationid. With ECHO defined (the benchmark's
 * mode "wasm") the output's data is the input's, as the bare subscriber
 * republishes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workmanager_wasm.h"

#ifndef OUT_TYPE
#define OUT_TYPE "wasm-out"
#endif

WM_PROCESS(in, in_len, out, out_len) {
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) {
        *out = vf_response_error("malformed input event", out_len);
        return 1;
    }
    vf_str tok = vf_event_find_extension(&ev, "fencingtoken");
    vf_str corr = vf_event_find_extension(&ev, "correlationid");
    const char* group = getenv("VIRTUFIN_WORKER_GROUP");
    char data[512];
    int len = snprintf(data, sizeof data, "{\"id\":\"%.*s\",\"fencingtoken\":\"%.*s\",\"group\":\"%s\"}",
                       (int)(ev.id.len < 100 ? ev.id.len : 100), ev.id.ptr ? ev.id.ptr : "",
                       (int)(tok.len < 40 ? tok.len : 40), tok.ptr ? tok.ptr : "", group ? group : "");
    vf_out_event o = {0};
    vf_kv kv;
    o.type = OUT_TYPE;
    o.datacontenttype = "application/json";
    o.data = (const uint8_t*)data;
    o.data_len = (size_t)len;
#ifdef ECHO
    o.data = ev.data.ptr;
    o.data_len = ev.data.len;
#endif
    if (corr.ptr) {
        kv.key = "correlationid";
        kv.value = corr.ptr;
        o.extensions = &kv;
        o.n_extensions = 1;
    }
    *out = vf_response_build(&o, 1, NULL, out_len);
    return *out == NULL ? 3 : 0;
}
