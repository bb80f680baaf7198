/*
 * virtufin_worker_api.h - the C ABI between WorkManager's native engine
 * (MIME type application/x-native-dll) and a native worker library.
 *
 * Vendor this header into your worker's sources. It has no dependencies
 * besides <stdint.h>. The messages that cross the ABI are FlatBuffers
 * buffers described by worker_api.fbs (next to this header); decode and
 * encode them with flatc-generated code (C++: flatc --cpp) or with the
 * small dependency-free C codec in virtufin_fb.h.
 *
 * ABI version 1
 * -------------
 * The library exports two functions (names configurable in manifest.json,
 * these are the defaults):
 *
 *   int32_t Process(const VirtufinHost* host,
 *                   const uint8_t* in, int32_t in_len,
 *                   uint8_t** out, int32_t* out_len);
 *   void    FreeResult(uint8_t* out);
 *
 * - in/in_len: a FlatBuffers buffer whose root is a CloudEvent table. It is
 *   owned by the host and valid only during the call; do not keep pointers
 *   into it.
 * - out/out_len: the worker may set *out to a buffer it allocated that
 *   holds a FlatBuffers WorkerResponse (root table). The host sets *out to
 *   NULL and *out_len to 0 before the call. Leaving *out NULL with a 0
 *   return means "no output event".
 * - return 0 on success. Any other value is a failure: the host reports
 *   "worker failed" with the code, plus the error_message of the response if
 *   one was returned. A response with error_message set is a failure even
 *   with return code 0.
 * - FreeResult(out) is called by the host exactly once for every non-NULL
 *   *out the worker returned, once the host is done with it, on error
 *   paths too (non-zero code, malformed response). It is never called
 *   with NULL. In process the host publishes the outputs' data straight
 *   from *out, so FreeResult may come after later Process calls and on
 *   another thread: the buffer must stay valid and unchanged until then.
 * - Process may be called concurrently from several threads, for the same
 *   or different events: it must be reentrant (no unsynchronised global
 *   state).
 * - Process must not unwind (C++ exceptions, longjmp) across the ABI.
 *
 * The host struct
 * ---------------
 * `host` points to a VirtufinHost that stays valid and unchanged from the
 * library's first Process call until the engine unloads the library (the
 * same pointer for every call of one loaded instance). Its functions take
 * host->engine_ptr as their first argument: it identifies the loaded worker
 * (an opaque handle, not a pointer you may dereference).
 *
 * Call the host functions only from inside a Process call, on the thread
 * that runs it (in-process, the host is a Go program: calling back from
 * threads it did not create is not supported).
 *
 * Layout (LP64: Linux/macOS x86-64 and arm64; Windows x64 has the same
 * offsets since every field is a pointer or a pair of int32):
 *
 *   offset  field
 *        0  engine_ptr
 *        8  abi_version   (int32, 1)
 *       12  struct_size   (int32, sizeof(VirtufinHost) as the host knows it)
 *       16  log
 *       24  gateway_call
 *       32  free_response
 *       40  worker_id     (NUL-terminated UTF-8, never NULL, may be "")
 *       48  worker_group
 *       56  worker_topic
 *
 * Fields are only ever appended; a worker built against a newer minor
 * layout must check struct_size before reading a field past what the host
 * filled in.
 */
#ifndef VIRTUFIN_WORKER_API_H
#define VIRTUFIN_WORKER_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes. Put it in manifest.json as
 * "abi_version". */
#define VIRTUFIN_ABI_VERSION 1

/* Log levels for VirtufinHost.log. They map to slog levels on the host:
 * trace and debug -> Debug, info -> Info, warn -> Warn, error -> Error. */
#define VIRTUFIN_LOG_TRACE 0
#define VIRTUFIN_LOG_DEBUG 1
#define VIRTUFIN_LOG_INFO 2
#define VIRTUFIN_LOG_WARN 3
#define VIRTUFIN_LOG_ERROR 4

/* Return codes of VirtufinHost.gateway_call. */
#define VIRTUFIN_GATEWAY_OK 0
#define VIRTUFIN_GATEWAY_ERROR 1       /* the call failed; *response holds the message */
#define VIRTUFIN_GATEWAY_UNAVAILABLE 2 /* no gateway configured on this node */
#define VIRTUFIN_GATEWAY_BAD_ARGS 3    /* NULL service/method, negative length, ... */

typedef struct VirtufinHost VirtufinHost;

/* Sends one log line (NUL-terminated UTF-8) to the worker's logger, tagged
 * with its worker_id. Lines longer than 64 KiB are truncated. */
typedef void (*VirtufinLogFn)(void* engine_ptr, int32_t level, const char* message);

/* Calls a backend service through the node's gateway (Dapr service
 * invocation on a WorkManager node). service and method are NUL-terminated;
 * request/request_len is the request body (JSON by convention).
 *
 * Returns VIRTUFIN_GATEWAY_OK and sets *response and *response_len to the
 * response body, or another code on failure, in which case *response may
 * hold a UTF-8 error message (not NUL-terminated; use *response_len).
 * Whenever *response is not NULL on return, release it with
 * host->free_response, exactly once. */
typedef int32_t (*VirtufinGatewayCallFn)(void* engine_ptr, const char* service, const char* method,
                                         const uint8_t* request, int32_t request_len,
                                         uint8_t** response, int32_t* response_len);

/* Releases a response buffer returned by gateway_call. */
typedef void (*VirtufinFreeResponseFn)(uint8_t* response);

struct VirtufinHost {
    void* engine_ptr;
    int32_t abi_version;
    int32_t struct_size;
    VirtufinLogFn log;
    VirtufinGatewayCallFn gateway_call;
    VirtufinFreeResponseFn free_response;
    const char* worker_id;
    const char* worker_group;
    const char* worker_topic;
};

/* The exports a worker library provides (default names). */
typedef int32_t (*VirtufinProcessFn)(const VirtufinHost* host, const uint8_t* in, int32_t in_len,
                                     uint8_t** out, int32_t* out_len);
typedef void (*VirtufinFreeResultFn)(uint8_t* out);

#if defined(_WIN32)
#define VIRTUFIN_EXPORT __declspec(dllexport)
#else
#define VIRTUFIN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
}
#endif

#endif /* VIRTUFIN_WORKER_API_H */
