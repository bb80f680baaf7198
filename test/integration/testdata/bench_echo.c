/* The native echo worker of BenchmarkEndToEnd: answers each event with one
 * event of type OUT_TYPE (the output topic, compiled in) carrying the input's
 * data. */
#include "virtufin_fb.h"
#include "virtufin_worker_api.h"

#ifndef OUT_TYPE
#define OUT_TYPE "bench-out"
#endif

VIRTUFIN_EXPORT int32_t Process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                int32_t* out_len) {
    (void)host;
    vf_event ev;
    if (vf_event_read(in, in_len, &ev) != 0) {
        *out = vf_response_error("malformed input event", out_len);
        return 1;
    }
    vf_out_event o = {0};
    o.type = OUT_TYPE;
    o.datacontenttype = ev.datacontenttype.ptr;
    o.data = ev.data.ptr;
    o.data_len = ev.data.len;
    *out = vf_response_build(&o, 1, NULL, out_len);
    return *out ? 0 : 2;
}

VIRTUFIN_EXPORT void FreeResult(uint8_t* out) { free(out); }
