/* The soak's native worker: answers each input with one event on OUT_TOPIC
 * (compiled in with -DOUT_TOPIC) whose data names the input id and the
 * compiled-in VERSION. Built with gcc by the test (kept out of the Go
 * package folder: testdata is ignored by go build). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "virtufin_fb.h"
#include "virtufin_worker_api.h"

#ifndef VERSION
#define VERSION "v1"
#endif
#ifndef OUT_TOPIC
#define OUT_TOPIC "native-out"
#endif

VIRTUFIN_EXPORT int32_t Process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                int32_t* out_len) {
    (void)host;
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) {
        *out = vf_response_error("malformed input event", out_len);
        return 1;
    }
    size_t n = ev.id.len + 128;
    char* data = malloc(n);
    int dl = snprintf(data, n, "{\"w\":\"native\",\"v\":\"%s\",\"id\":\"%.*s\"}", VERSION, (int)ev.id.len, ev.id.ptr);
    vf_out_event o = {0};
    o.type = OUT_TOPIC;
    o.datacontenttype = "application/json";
    o.data = (const uint8_t*)data;
    o.data_len = (size_t)dl;
    *out = vf_response_build(&o, 1, NULL, out_len);
    free(data);
    return *out ? 0 : 2;
}

VIRTUFIN_EXPORT void FreeResult(uint8_t* out) { free(out); }
