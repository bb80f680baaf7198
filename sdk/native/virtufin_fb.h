/*
 * virtufin_fb.h - a small, dependency-free, header-only C codec for the two
 * FlatBuffers messages of the WorkManager native worker ABI
 * (worker_api.fbs): it reads the input CloudEvent and builds a
 * WorkerResponse. Use it from C when flatcc is not at hand; from C++ prefer
 * the flatc-generated code (flatc --cpp worker_api.fbs), see
 * examples/echo-cpp.
 *
 * The reader checks every offset and length against the buffer, so a
 * malformed buffer gives an error, never an out-of-bounds read. Strings it
 * returns point into the input buffer (valid during the Process call only)
 * and are NUL-terminated.
 *
 * The builder writes a valid FlatBuffer front to back (vtable, table, then
 * the children, all offsets pointing forward) into one malloc'd buffer:
 * return it as Process' *out and release it with free() in FreeResult.
 *
 * Field order below must follow worker_api.fbs (FlatBuffers field ids).
 */
#ifndef VIRTUFIN_FB_H
#define VIRTUFIN_FB_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- field ids (order of declaration in worker_api.fbs) ------------- */
enum {
    VF_EXT_KEY = 0,
    VF_EXT_VALUE = 1,
    VF_EXT_NFIELDS = 2
};
enum {
    VF_EV_ID = 0,
    VF_EV_SOURCE = 1,
    VF_EV_TYPE = 2,
    VF_EV_SPECVERSION = 3,
    VF_EV_DATACONTENTTYPE = 4,
    VF_EV_SUBJECT = 5,
    VF_EV_TIME = 6,
    VF_EV_DATA = 7,
    VF_EV_EXTENSIONS = 8,
    VF_EV_DATASCHEMA = 9,
    VF_EV_NFIELDS = 10
};
enum {
    VF_RESP_RESULT_EVENT = 0,
    VF_RESP_ERROR_MESSAGE = 1,
    VF_RESP_RESULT_EVENTS = 2,
    VF_RESP_NFIELDS = 3
};

/* A string inside a buffer: ptr is NULL when the field is absent;
 * otherwise ptr[len] == '\0'. */
typedef struct vf_str {
    const char* ptr;
    uint32_t len;
} vf_str;

typedef struct vf_bytes {
    const uint8_t* ptr; /* NULL when absent */
    uint32_t len;
} vf_bytes;

/* A decoded input event. */
typedef struct vf_event {
    vf_str id, source, type, specversion, datacontenttype, subject, time, dataschema;
    vf_bytes data;
    uint32_t n_extensions;
    /* private */
    const uint8_t* buf_;
    uint32_t len_;
    uint32_t ext_vec_;
} vf_event;

/* ---- reader ---------------------------------------------------------- */

static inline int vf__u32(const uint8_t* b, uint32_t len, uint64_t pos, uint32_t* v) {
    if (pos + 4 > len) return -1;
    *v = (uint32_t)b[pos] | (uint32_t)b[pos + 1] << 8 | (uint32_t)b[pos + 2] << 16 | (uint32_t)b[pos + 3] << 24;
    return 0;
}

static inline int vf__u16(const uint8_t* b, uint32_t len, uint64_t pos, uint32_t* v) {
    if (pos + 2 > len) return -1;
    *v = (uint32_t)b[pos] | (uint32_t)b[pos + 1] << 8;
    return 0;
}

/* A table at pos: its vtable position and sizes, checked. */
typedef struct vf__table {
    uint32_t pos, vt, vtsize, tblsize;
} vf__table;

static inline int vf__table_at(const uint8_t* b, uint32_t len, uint64_t pos, vf__table* t) {
    uint32_t so;
    if (vf__u32(b, len, pos, &so) != 0) return -1;
    int64_t vt = (int64_t)pos - (int64_t)(int32_t)so;
    if (vt < 0 || vt + 4 > (int64_t)len) return -1;
    t->pos = (uint32_t)pos;
    t->vt = (uint32_t)vt;
    if (vf__u16(b, len, t->vt, &t->vtsize) != 0 || vf__u16(b, len, t->vt + 2, &t->tblsize) != 0) return -1;
    if (t->vtsize < 4 || (uint64_t)t->vt + t->vtsize > len || (uint64_t)t->pos + t->tblsize > len || t->tblsize < 4)
        return -1;
    return 0;
}

/* Position of the object an offset field points to; 0 when absent, -1 on
 * a malformed buffer. */
static inline int64_t vf__field_ref(const uint8_t* b, uint32_t len, const vf__table* t, int field) {
    uint32_t voff = 4 + 2 * (uint32_t)field, off, rel;
    if (voff + 2 > t->vtsize) return 0;
    if (vf__u16(b, len, (uint64_t)t->vt + voff, &off) != 0) return -1;
    if (off == 0) return 0;
    if (off + 4 > t->tblsize) return -1;
    uint64_t fpos = (uint64_t)t->pos + off;
    if (vf__u32(b, len, fpos, &rel) != 0) return -1;
    uint64_t target = fpos + rel;
    if (rel == 0 || target >= len) return -1;
    return (int64_t)target;
}

static inline int vf__string(const uint8_t* b, uint32_t len, const vf__table* t, int field, vf_str* s) {
    s->ptr = NULL;
    s->len = 0;
    int64_t p = vf__field_ref(b, len, t, field);
    if (p < 0) return -1;
    if (p == 0) return 0;
    uint32_t n;
    if (vf__u32(b, len, (uint64_t)p, &n) != 0) return -1;
    if ((uint64_t)p + 4 + n + 1 > len || b[p + 4 + n] != 0) return -1;
    s->ptr = (const char*)(b + p + 4);
    s->len = n;
    return 0;
}

static inline int vf__bytes(const uint8_t* b, uint32_t len, const vf__table* t, int field, vf_bytes* v) {
    v->ptr = NULL;
    v->len = 0;
    int64_t p = vf__field_ref(b, len, t, field);
    if (p < 0) return -1;
    if (p == 0) return 0;
    uint32_t n;
    if (vf__u32(b, len, (uint64_t)p, &n) != 0) return -1;
    if ((uint64_t)p + 4 + n > len) return -1;
    v->ptr = b + p + 4;
    v->len = n;
    return 0;
}

/* Reads the root CloudEvent of an input buffer. Returns 0, or -1 when the
 * buffer is malformed. */
static inline int vf_event_read(const uint8_t* buf, int32_t len32, vf_event* ev) {
    memset(ev, 0, sizeof(*ev));
    if (buf == NULL || len32 < 8) return -1;
    uint32_t len = (uint32_t)len32, root;
    vf__table t;
    if (vf__u32(buf, len, 0, &root) != 0 || vf__table_at(buf, len, root, &t) != 0) return -1;
    if (vf__string(buf, len, &t, VF_EV_ID, &ev->id) || vf__string(buf, len, &t, VF_EV_SOURCE, &ev->source) ||
        vf__string(buf, len, &t, VF_EV_TYPE, &ev->type) ||
        vf__string(buf, len, &t, VF_EV_SPECVERSION, &ev->specversion) ||
        vf__string(buf, len, &t, VF_EV_DATACONTENTTYPE, &ev->datacontenttype) ||
        vf__string(buf, len, &t, VF_EV_SUBJECT, &ev->subject) || vf__string(buf, len, &t, VF_EV_TIME, &ev->time) ||
        vf__string(buf, len, &t, VF_EV_DATASCHEMA, &ev->dataschema) ||
        vf__bytes(buf, len, &t, VF_EV_DATA, &ev->data))
        return -1;
    int64_t vec = vf__field_ref(buf, len, &t, VF_EV_EXTENSIONS);
    if (vec < 0) return -1;
    if (vec > 0) {
        uint32_t n;
        if (vf__u32(buf, len, (uint64_t)vec, &n) != 0 || (uint64_t)vec + 4 + (uint64_t)n * 4 > len) return -1;
        ev->n_extensions = n;
        ev->ext_vec_ = (uint32_t)vec;
    }
    ev->buf_ = buf;
    ev->len_ = len;
    return 0;
}

/* The i-th extension attribute. Returns 0, or -1 (out of range or
 * malformed). */
static inline int vf_event_extension(const vf_event* ev, uint32_t i, vf_str* key, vf_str* value) {
    if (i >= ev->n_extensions) return -1;
    uint64_t e = (uint64_t)ev->ext_vec_ + 4 + (uint64_t)i * 4;
    uint32_t rel;
    vf__table t;
    if (vf__u32(ev->buf_, ev->len_, e, &rel) != 0 || rel == 0) return -1;
    if (vf__table_at(ev->buf_, ev->len_, e + rel, &t) != 0) return -1;
    if (vf__string(ev->buf_, ev->len_, &t, VF_EXT_KEY, key) || vf__string(ev->buf_, ev->len_, &t, VF_EXT_VALUE, value))
        return -1;
    return key->ptr ? 0 : -1;
}

/* The value of the extension named key (ptr NULL when there is none). */
static inline vf_str vf_event_find_extension(const vf_event* ev, const char* key) {
    vf_str k, v, none = {NULL, 0};
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < ev->n_extensions; i++) {
        if (vf_event_extension(ev, i, &k, &v) == 0 && k.len == kl && memcmp(k.ptr, key, kl) == 0) return v;
    }
    return none;
}

/* ---- builder --------------------------------------------------------- */

typedef struct vf_kv {
    const char* key;
    const char* value;
} vf_kv;

/* An output event. NULL strings are left out; "type" is required by the
 * host, "id" and "source" are filled in by WorkManager when empty. */
typedef struct vf_out_event {
    const char *id, *source, *type, *specversion, *datacontenttype, *subject, *time, *dataschema;
    const uint8_t* data; /* NULL: no data */
    size_t data_len;
    const vf_kv* extensions;
    size_t n_extensions;
} vf_out_event;

typedef struct vf__buf {
    uint8_t* b;
    size_t len, cap;
    int oom;
} vf__buf;

/* Reserves n zero bytes aligned to align; returns their position. */
static inline size_t vf__alloc(vf__buf* w, size_t n, size_t align) {
    size_t pos = (w->len + align - 1) & ~(align - 1);
    if (w->oom || pos + n > (size_t)INT32_MAX) {
        w->oom = 1;
        return 0;
    }
    if (pos + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < pos + n) cap *= 2;
        uint8_t* nb = (uint8_t*)realloc(w->b, cap);
        if (nb == NULL) {
            w->oom = 1;
            return 0;
        }
        w->b = nb;
        w->cap = cap;
    }
    memset(w->b + w->len, 0, pos + n - w->len);
    w->len = pos + n;
    return pos;
}

static inline void vf__put_u16(vf__buf* w, size_t pos, uint32_t v) {
    if (w->oom) return;
    w->b[pos] = (uint8_t)v;
    w->b[pos + 1] = (uint8_t)(v >> 8);
}

static inline void vf__put_u32(vf__buf* w, size_t pos, uint32_t v) {
    if (w->oom) return;
    w->b[pos] = (uint8_t)v;
    w->b[pos + 1] = (uint8_t)(v >> 8);
    w->b[pos + 2] = (uint8_t)(v >> 16);
    w->b[pos + 3] = (uint8_t)(v >> 24);
}

/* Points the offset slot at target (which lies after it). */
static inline void vf__patch(vf__buf* w, size_t slot, size_t target) {
    if (slot == 0 || target <= slot) return; /* absent field, or out of memory */
    vf__put_u32(w, slot, (uint32_t)(target - slot));
}

/* Writes a vtable and a table whose fields are all offsets; slots[i] gets
 * the position of field i's slot (0 when absent). */
static inline size_t vf__write_table(vf__buf* w, int nfields, const int* present, size_t* slots) {
    int last = -1, count = 0;
    for (int i = 0; i < nfields; i++) {
        slots[i] = 0;
        if (present[i]) {
            last = i;
            count++;
        }
    }
    size_t vtsize = 4 + 2 * (size_t)(last + 1), tblsize = 4 + 4 * (size_t)count;
    size_t vt = vf__alloc(w, vtsize, 2);
    size_t tbl = vf__alloc(w, tblsize, 4);
    if (w->oom) return 0;
    vf__put_u16(w, vt, (uint32_t)vtsize);
    vf__put_u16(w, vt + 2, (uint32_t)tblsize);
    int j = 0;
    for (int i = 0; i <= last; i++) {
        if (present[i]) {
            vf__put_u16(w, vt + 4 + 2 * (size_t)i, (uint32_t)(4 + 4 * j));
            slots[i] = tbl + 4 + 4 * (size_t)j;
            j++;
        }
    }
    vf__put_u32(w, tbl, (uint32_t)(tbl - vt));
    return tbl;
}

static inline size_t vf__bytes_vec(vf__buf* w, const void* p, size_t n, int nul) {
    size_t pos = vf__alloc(w, 4 + n + (nul ? 1 : 0), 4);
    if (w->oom) return 0;
    vf__put_u32(w, pos, (uint32_t)n);
    if (n) memcpy(w->b + pos + 4, p, n);
    return pos;
}

static inline void vf__string_field(vf__buf* w, size_t slot, const char* s) {
    if (s == NULL || slot == 0) return;
    size_t pos = vf__bytes_vec(w, s, strlen(s), 1);
    vf__patch(w, slot, pos);
}

static inline size_t vf__event(vf__buf* w, const vf_out_event* e) {
    int present[VF_EV_NFIELDS] = {0};
    size_t slots[VF_EV_NFIELDS];
    present[VF_EV_ID] = e->id != NULL;
    present[VF_EV_SOURCE] = e->source != NULL;
    present[VF_EV_TYPE] = e->type != NULL;
    present[VF_EV_SPECVERSION] = e->specversion != NULL;
    present[VF_EV_DATACONTENTTYPE] = e->datacontenttype != NULL;
    present[VF_EV_SUBJECT] = e->subject != NULL;
    present[VF_EV_TIME] = e->time != NULL;
    present[VF_EV_DATA] = e->data != NULL;
    present[VF_EV_EXTENSIONS] = e->n_extensions > 0;
    present[VF_EV_DATASCHEMA] = e->dataschema != NULL;
    size_t tbl = vf__write_table(w, VF_EV_NFIELDS, present, slots);
    vf__string_field(w, slots[VF_EV_ID], e->id);
    vf__string_field(w, slots[VF_EV_SOURCE], e->source);
    vf__string_field(w, slots[VF_EV_TYPE], e->type);
    vf__string_field(w, slots[VF_EV_SPECVERSION], e->specversion);
    vf__string_field(w, slots[VF_EV_DATACONTENTTYPE], e->datacontenttype);
    vf__string_field(w, slots[VF_EV_SUBJECT], e->subject);
    vf__string_field(w, slots[VF_EV_TIME], e->time);
    vf__string_field(w, slots[VF_EV_DATASCHEMA], e->dataschema);
    if (e->data != NULL) vf__patch(w, slots[VF_EV_DATA], vf__bytes_vec(w, e->data, e->data_len, 0));
    if (e->n_extensions > 0) {
        size_t vec = vf__alloc(w, 4 + 4 * e->n_extensions, 4);
        vf__put_u32(w, vec, (uint32_t)e->n_extensions);
        vf__patch(w, slots[VF_EV_EXTENSIONS], vec);
        for (size_t i = 0; i < e->n_extensions && !w->oom; i++) {
            int p[VF_EXT_NFIELDS] = {1, e->extensions[i].value != NULL};
            size_t s[VF_EXT_NFIELDS];
            size_t kv = vf__write_table(w, VF_EXT_NFIELDS, p, s);
            vf__patch(w, vec + 4 + 4 * i, kv);
            vf__string_field(w, s[VF_EXT_KEY], e->extensions[i].key ? e->extensions[i].key : "");
            vf__string_field(w, s[VF_EXT_VALUE], e->extensions[i].value);
        }
    }
    return tbl;
}

/* Builds a WorkerResponse: n output events and, when it is not NULL, the
 * error_message of the worker's error answer (with return code 0: a
 * worker.error event, then the events as its error response, or a default
 * one when n is 0; no retry). Returns a malloc'd buffer (release it with
 * free()) and its length, or NULL when out of memory. */
static inline uint8_t* vf_response_build(const vf_out_event* events, size_t n, const char* error_message,
                                         int32_t* out_len) {
    vf__buf w = {NULL, 0, 0, 0};
    int present[VF_RESP_NFIELDS] = {0};
    size_t slots[VF_RESP_NFIELDS];
    if (error_message != NULL) present[VF_RESP_ERROR_MESSAGE] = 1;
    if (n == 1) {
        present[VF_RESP_RESULT_EVENT] = 1;
    } else if (n > 1) {
        present[VF_RESP_RESULT_EVENTS] = 1;
    }
    size_t root = vf__alloc(&w, 4, 4);
    size_t tbl = vf__write_table(&w, VF_RESP_NFIELDS, present, slots);
    vf__put_u32(&w, root, (uint32_t)tbl);
    vf__string_field(&w, slots[VF_RESP_ERROR_MESSAGE], error_message);
    if (n == 1) {
        vf__patch(&w, slots[VF_RESP_RESULT_EVENT], vf__event(&w, &events[0]));
    } else if (n > 1) {
        size_t vec = vf__alloc(&w, 4 + 4 * n, 4);
        vf__put_u32(&w, vec, (uint32_t)n);
        vf__patch(&w, slots[VF_RESP_RESULT_EVENTS], vec);
        for (size_t i = 0; i < n && !w.oom; i++) vf__patch(&w, vec + 4 + 4 * i, vf__event(&w, &events[i]));
    }
    if (w.oom) {
        free(w.b);
        *out_len = 0;
        return NULL;
    }
    *out_len = (int32_t)w.len;
    return w.b;
}

/* Shorthand for a failure response. */
static inline uint8_t* vf_response_error(const char* message, int32_t* out_len) {
    return vf_response_build(NULL, 0, message ? message : "", out_len);
}

#ifdef __cplusplus
}
#endif

#endif /* VIRTUFIN_FB_H */
