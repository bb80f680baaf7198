// echo (C++) - the example worker of ../echo-c written against the
// flatc-generated C++ API (flatc --cpp ../../worker_api.fbs, headers from
// libflatbuffers-dev). It echoes every event as "example.echoed" with the
// input's data and correlationid, and logs one line per event.
//
// Build and package: make package
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "virtufin_worker_api.h"
#include "worker_api_generated.h"

using namespace virtufin::worker;

namespace {

// Hands a finished builder to the host in a malloc'd copy (FreeResult frees
// it).
int32_t hand_over(flatbuffers::FlatBufferBuilder& b, uint8_t** out, int32_t* out_len) {
    auto* buf = static_cast<uint8_t*>(std::malloc(b.GetSize()));
    if (buf == nullptr) return 2;
    std::memcpy(buf, b.GetBufferPointer(), b.GetSize());
    *out = buf;
    *out_len = static_cast<int32_t>(b.GetSize());
    return 0;
}

int32_t fail(const char* msg, uint8_t** out, int32_t* out_len) {
    flatbuffers::FlatBufferBuilder b(256);
    b.Finish(CreateWorkerResponse(b, 0, b.CreateString(msg)));
    hand_over(b, out, out_len);
    return 1;
}

int32_t process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out, int32_t* out_len) {
    flatbuffers::Verifier verifier(in, static_cast<size_t>(in_len));
    if (!verifier.VerifyBuffer<CloudEvent>(nullptr)) return fail("malformed input event", out, out_len);
    const CloudEvent* ev = flatbuffers::GetRoot<CloudEvent>(in);

    std::string line = std::string("worker ") + host->worker_id + " got event " +
                       (ev->id() ? ev->id()->str() : std::string()) + " of type " +
                       (ev->type() ? ev->type()->str() : std::string());
    host->log(host->engine_ptr, VIRTUFIN_LOG_INFO, line.c_str());

    flatbuffers::FlatBufferBuilder b(1024 + (ev->data() ? ev->data()->size() : 0));
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> data;
    if (ev->data()) data = b.CreateVector(ev->data()->data(), ev->data()->size());
    std::vector<flatbuffers::Offset<Extension>> exts;
    if (ev->extensions()) {
        for (const Extension* x : *ev->extensions()) {
            if (x->key() && x->key()->str() == "correlationid")
                exts.push_back(CreateExtension(b, b.CreateString(x->key()), b.CreateString(x->value())));
        }
    }
    auto ct = ev->datacontenttype() ? b.CreateString(ev->datacontenttype()) : 0;
    auto result = CreateCloudEvent(b, /*id*/ 0, /*source*/ 0, b.CreateString("example.echoed"), /*specversion*/ 0, ct,
                                   /*subject*/ 0, /*time*/ 0, data, exts.empty() ? 0 : b.CreateVector(exts));
    b.Finish(CreateWorkerResponse(b, result));
    return hand_over(b, out, out_len);
}

}  // namespace

extern "C" VIRTUFIN_EXPORT int32_t Process(const VirtufinHost* host, const uint8_t* in, int32_t in_len, uint8_t** out,
                                           int32_t* out_len) {
    // Never let an exception cross the C ABI.
    try {
        return process(host, in, in_len, out, out_len);
    } catch (const std::exception& e) {
        return fail(e.what(), out, out_len);
    } catch (...) {
        return fail("unknown C++ exception", out, out_len);
    }
}

extern "C" VIRTUFIN_EXPORT void FreeResult(uint8_t* out) { std::free(out); }
