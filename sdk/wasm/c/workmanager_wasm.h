/*
 * workmanager_wasm.h - the C side of WorkManager's WebAssembly worker ABI
 * (MIME type application/wasm), version 1. See ../README.md.
 *
 * Build a worker as a WASI reactor module with Debian's clang:
 *
 *   clang --target=wasm32-wasi -O2 -mexec-model=reactor \
 *         -I sdk/native -I sdk/wasm/c -o worker.wasm worker.c
 *
 * The messages are the native ABI's FlatBuffers (sdk/native/worker_api.fbs);
 * read and build them with sdk/native/virtufin_fb.h, included here.
 *
 * A module exports:
 *
 *   memory                                   its linear memory
 *   int32_t abi_version(void)                returns WM_ABI_VERSION (1)
 *   void*   alloc(int32_t size)              a buffer of size bytes (NULL: none)
 *   void    dealloc(void* p)                 releases what alloc returned, and responses
 *   int32_t process(const uint8_t* in, int32_t in_len,
 *                   uint8_t** out, int32_t* out_len)
 *
 * process is the native ABI's Process without the host struct: in/in_len is
 * the input CloudEvent (the engine's buffer, valid during the call only);
 * set *out to a WorkerResponse you allocated (NULL: no output); return 0, or
 * a failure code (the response's error_message explains it). The engine
 * copies the response as soon as process returns and never frees it: the
 * module releases it at its next process call. WM_PROCESS below does that
 * for a response from malloc (vf_response_build, vf_response_error).
 * This header defines abi_version, alloc and dealloc (malloc/free) unless
 * WM_NO_DEFAULT_EXPORTS is defined: include it in one .c file of the module
 * that way.
 *
 * Host functions (import module "workmanager"), valid during a call only:
 * log, gateway_call and gateway_response, wrapped below as wm_log and
 * wm_gateway_call. WASI gives the worker's identity as environment
 * (VIRTUFIN_WORKER_ID, VIRTUFIN_WORKER_GROUP, VIRTUFIN_WORKER_TOPIC), a
 * monotonic clock, random bytes, stdout/stderr as log lines, and no files.
 */
#ifndef WORKMANAGER_WASM_H
#define WORKMANAGER_WASM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "virtufin_fb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WM_ABI_VERSION 1

/* Log levels (those of the native ABI). */
#define WM_LOG_TRACE 0
#define WM_LOG_DEBUG 1
#define WM_LOG_INFO 2
#define WM_LOG_WARN 3
#define WM_LOG_ERROR 4

/* Return codes of wm_gateway_call (those of the native ABI). */
#define WM_GATEWAY_OK 0
#define WM_GATEWAY_ERROR 1       /* the call failed; the response holds the message */
#define WM_GATEWAY_UNAVAILABLE 2 /* no gateway on this node */
#define WM_GATEWAY_BAD_ARGS 3    /* empty service or method, argument outside memory */

#define WM_EXPORT(name) __attribute__((export_name(name)))
#define WM_IMPORT(name) __attribute__((import_module("workmanager"), import_name(name)))

/* The raw host functions. */
WM_IMPORT("log") void wm_host_log(int32_t level, const char* msg, int32_t len);
WM_IMPORT("gateway_call")
int64_t wm_host_gateway_call(const char* service, int32_t service_len, const char* method, int32_t method_len,
                             const uint8_t* request, int32_t request_len);
WM_IMPORT("gateway_response") int32_t wm_host_gateway_response(uint8_t* buf, int32_t cap);

/* wm_log sends one line (NUL-terminated; at most 64 KiB) to the worker's
 * log. */
static inline void wm_log(int32_t level, const char* msg) { wm_host_log(level, msg, (int32_t)strlen(msg)); }

/* wm_gateway_call calls service/method through the node's gateway (under
 * the worker's allowed_gateway_targets and, for a worker with a group, its
 * group lock's fencing token) and returns a WM_GATEWAY_* code. *response
 * (malloc'd, free() it; NULL when empty) holds the response body, or the
 * error text when the code is not WM_GATEWAY_OK. */
static inline int32_t wm_gateway_call(const char* service, const char* method, const uint8_t* request,
                                      int32_t request_len, uint8_t** response, int32_t* response_len) {
    int64_t r = wm_host_gateway_call(service, (int32_t)strlen(service), method, (int32_t)strlen(method), request,
                                     request_len);
    int32_t code = (int32_t)(r >> 32);
    uint32_t n = (uint32_t)r;
    *response = NULL;
    *response_len = 0;
    if (n > 0) {
        uint8_t* buf = malloc(n);
        if (buf == NULL) return WM_GATEWAY_ERROR;
        int32_t got = wm_host_gateway_response(buf, (int32_t)n);
        if (got < 0) {
            free(buf);
            return WM_GATEWAY_ERROR;
        }
        *response = buf;
        *response_len = got;
    }
    return code;
}

#ifndef WM_NO_DEFAULT_EXPORTS
WM_EXPORT("abi_version") int32_t wm_abi_version(void) { return WM_ABI_VERSION; }
WM_EXPORT("alloc") void* wm_alloc(int32_t size) { return malloc(size > 0 ? (size_t)size : 1); }
WM_EXPORT("dealloc") void wm_dealloc(void* p) { free(p); }
#endif

/* WM_PROCESS defines the process export around your function, which sets
 * *out to a malloc'd response (or leaves it NULL) as the native ABI's
 * Process does; the previous call's response is freed when the next call
 * starts:
 *
 *   WM_PROCESS(in, in_len, out, out_len) { ... return 0; } */
#define WM_PROCESS(in, in_len, out, out_len)                                                           \
    static int32_t wm_user_process(const uint8_t* in, int32_t in_len, uint8_t** out, int32_t* out_len); \
    static uint8_t* wm_last_response;                                                                  \
    WM_EXPORT("process") int32_t wm_process(const uint8_t* in_, int32_t len_, uint8_t** out_, int32_t* outlen_) { \
        free(wm_last_response);                                                                        \
        wm_last_response = NULL;                                                                       \
        int32_t rc_ = wm_user_process(in_, len_, out_, outlen_);                                       \
        wm_last_response = *out_;                                                                      \
        return rc_;                                                                                    \
    }                                                                                                  \
    static int32_t wm_user_process(const uint8_t* in, int32_t in_len, uint8_t** out, int32_t* out_len)

#ifdef __cplusplus
}
#endif

#endif /* WORKMANAGER_WASM_H */
