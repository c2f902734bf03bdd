/* prism_rr._speedups: the recorder's per-call path in C, where a compiler was present.
 *
 * Optional: pip builds it on install when it can (setup.py, `optional=True`), and every
 * function here has a pure-Python twin that writes the same bytes (format/calllog.py's
 * Cursor, intercept/stack.py's caller_stack, recorder/_calls.py's CallRecorder.blocking);
 * PRISM_RR_PURE_PYTHON=1 makes prism-rr use the twins. Nothing here imports torch or
 * reads a tensor's data: a tensor's bytes come as a pointer and a length that the caller
 * read from torch (CallState reads tensors' `shape` and `dtype` as any attribute).
 *
 * Cursor: the writing position of a call log's ring and its two hot entries, ENTER and
 * DONE, laid out as format/calllog.py lays them out: the layout is read from there (its
 * public structs and constants) where the first Cursor is made, never spelled here
 * (FORMAT.md, "Call log"). Each method runs whole with the GIL held, so no other Python
 * thread writes in between. When the entry needs the slow path (padding to the ring's end,
 * room made by dropping old entries, a compactor reading: `busy`; a value its field cannot
 * hold), the method writes nothing and calls `slow_enter` or `slow_done` with its own
 * arguments (the Python path, which takes the log's lock), or returns -2.
 *
 * stack: caller_stack's walk over the caller's frames, from its caches only (and caches of
 * its own in front of them); False on any miss (the Python walk fills the caches). On
 * Python 3.11 it reads the interpreter's frames, making no frame objects.
 *
 * CallState: the base of recorder/_calls.py's CallRecorder, holding its hot attributes,
 * and `fast_blocking`, its blocking call path (enter, run, wait, complete) for the common
 * case, written with the two above; anything else it hands to the Python path
 * (CallRecorder._blocking_py) before it writes anything. `bind`, called once by
 * _calls.py, gives it intercept/group.py's Call (a prototype of it: a Call made here is
 * Call(...) as its __init__ leaves it) and enter's arguments by name. Everything it reads
 * of other modules is given to it (bind, CallState's members), by their public names. The
 * same tests run on both paths (tests/recorder/test_call_path.py, test_blocking_path.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* Python 3.11: the caller's frames walked as the interpreter keeps them, without making a
 * frame object for each (PyFrame_GetBack does: an allocation and a free per frame, most
 * of what a stack cost). Its layout is the interpreter's own, so only for the version it
 * was read from; other versions walk frame objects. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(PRISM_RR_FRAME_OBJECTS)
#define PRISM_RR_RAW_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    char *ring;
    long long ring_at;
    long long ring_size;
    long long head;
    long long tail;
    long long tail_seq;
    long long seq;
    int busy;
    PyObject *open; /* dict: call id -> ring position of its ENTER; NULL: not kept (a spool's log) */
    /* the newest call entered, not yet in `open`: a blocking call's ENTER and DONE then
     * touch no dict (flush_open puts it there before Python reads `open`) */
    long long last_cid, last_pos;
    int has_last;
    PyObject *slow_enter; /* what enter and done call instead when they cannot write here */
    PyObject *slow_done;
} Cursor;

static inline void put_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_i32(char *p, int32_t v) { memcpy(p, &v, 4); }
static inline void put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }
static inline void put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }

#if PY_BIG_ENDIAN
#error "prism_rr._speedups writes little-endian entries: build without it (the pure-Python path)"
#endif

/* --- the call log's entry layout, taken from format/calllog.py ------------------------
 *
 * Nothing of an entry's layout is spelled here: the first Cursor (or `entry_layout`) reads
 * it from format/calllog.py's public names: the structs HEAD, ENTER_BODY, ENTER, DONE_BODY,
 * DONE, PAYLOAD_HEAD and ONE_BYTES, CID_AT, SEQ_KEY, ALIGN, the entry types and the ENTER
 * flags the blocking path sets. An ENTER's fields after the head are enter's arguments
 * after `flags`, in order, the call id (at CID_AT) left out: the rule CallLog._enter packs
 * by. A DONE's are done's (call id, end, issued, peer, a zero, call seq), their widths from
 * DONE_BODY. What this code cannot write (a code other than an integer's, a head or a
 * payload head of another shape, a DONE of other fields) is refused by name, as an error
 * where the layout is read: a layout and a writer that disagree never meet. */
#define MAX_FIELDS 32

typedef struct {
    int off;       /* in the entry */
    char code;     /* struct's: b B h H i I q Q */
    uint64_t lo, span; /* the values it holds, lo to lo + span (struct.pack_into refuses others) */
    uint64_t mask; /* its width's bytes */
} Field;

typedef struct {
    uint64_t seq_key;
    long long align;
    int t_enter, t_done, aux_payload, e_p2p, e_recv, e_same_out;
    long long one_bytes;                /* ONE_BYTES.size: a payload of one tensor's bytes, before them */
    int enter_n, enter_cid;             /* an ENTER's fields after the head; which one is the call id */
    int enter_pads, done_pads;          /* zeros between fields ('x'): the body is zeroed first */
    Field enter[MAX_FIELDS];
    Field enter_args[MAX_FIELDS];       /* the same but the call id: what enter's arguments fill */
    int enter_cid_off;
    long long enter_body, enter_size;   /* ENTER_BODY.size, ENTER.size */
    Field done[6];                      /* call id, end, issued, peer, (zero), call seq */
    long long done_body, done_size;
} Layout;

static Layout L;
static int layout_loaded = 0;
#define ENTER_ARGS (L.enter_n) /* enter's arguments but the payload: flags, then the fields but the call id */

static int
layout_error(const char *what)
{
    PyErr_Format(PyExc_ValueError, "prism_rr._speedups cannot write this call log layout (format/calllog.py): %s", what);
    return -1;
}

/* The fields of a little-endian struct format after its 4-field head ("<IBBH"): 0, or -1. */
static int
parse_fields(const char *fmt, Field *out, int max, int *n, long long *size, int *pads)
{
    if (fmt[0] != '<' || strncmp(fmt + 1, "IBBH", 4) != 0)
        return layout_error("an entry's struct does not begin \"<IBBH\" (length, type, flags, aux)");
    long long off = 8;
    int k = 0;
    *pads = 0;
    for (const char *p = fmt + 5; *p; p++) {
        long long count = 1;
        if (*p >= '0' && *p <= '9') {
            count = 0;
            while (*p >= '0' && *p <= '9')
                count = count * 10 + (*p++ - '0');
            if (*p == 0)
                return layout_error("a count with no code in an entry's struct");
        }
        int width;
        long long lo, hi;
        switch (*p) {
        case 'x': off += count; *pads = 1; continue; /* padding: zeros */
        case 'b': width = 1; lo = INT8_MIN; hi = INT8_MAX; break;
        case 'B': width = 1; lo = 0; hi = UINT8_MAX; break;
        case 'h': width = 2; lo = INT16_MIN; hi = INT16_MAX; break;
        case 'H': width = 2; lo = 0; hi = UINT16_MAX; break;
        case 'i': width = 4; lo = INT32_MIN; hi = INT32_MAX; break;
        case 'I': width = 4; lo = 0; hi = UINT32_MAX; break;
        case 'q': width = 8; lo = INT64_MIN; hi = INT64_MAX; break;
        case 'Q': width = 8; lo = 0; hi = INT64_MAX; break; /* past it: an int no long long holds, the slow path's */
        default:
            PyErr_Format(PyExc_ValueError, "prism_rr._speedups cannot write this call log layout (format/calllog.py): "
                         "code '%c' in %s", *p, fmt);
            return -1;
        }
        for (long long i = 0; i < count; i++) {
            if (k == max)
                return layout_error("an entry of too many fields");
            out[k].off = (int)off;
            out[k].code = *p;
            out[k].lo = (uint64_t)lo;
            out[k].span = (uint64_t)hi - (uint64_t)lo;
            out[k].mask = width == 8 ? ~0ULL : (1ULL << (8 * width)) - 1;
            off += width;
            k++;
        }
    }
    *n = k;
    *size = off;
    return 0;
}

static int
get_ll(PyObject *ns, const char *name, long long *v)
{
    PyObject *o = PyObject_GetAttrString(ns, name);
    if (o == NULL)
        return -1;
    *v = PyLong_AsLongLong(o);
    Py_DECREF(o);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A struct's format (a new reference to a str) and size. */
static PyObject *
get_struct(PyObject *ns, const char *name, long long *size)
{
    PyObject *s = PyObject_GetAttrString(ns, name);
    if (s == NULL)
        return NULL;
    PyObject *fmt = PyObject_GetAttrString(s, "format");
    int ok = fmt != NULL && PyUnicode_Check(fmt) && get_ll(s, "size", size) == 0;
    Py_DECREF(s);
    if (!ok) {
        Py_XDECREF(fmt);
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: a struct.Struct", name);
        return NULL;
    }
    return fmt;
}

static int
same_format(PyObject *ns, const char *name, const char *want)
{
    long long size;
    PyObject *fmt = get_struct(ns, name, &size);
    if (fmt == NULL)
        return -1;
    int same = PyUnicode_CompareWithASCIIString(fmt, want) == 0;
    Py_DECREF(fmt);
    if (!same) {
        PyErr_Format(PyExc_ValueError, "prism_rr._speedups cannot write this call log layout (format/calllog.py): "
                     "%s is not \"%s\", as the payloads written here are", name, want);
        return -1;
    }
    return 0;
}

/* Read the layout from `ns` (format/calllog.py, or anything with its names) into `out`. */
static int
read_layout(PyObject *ns, Layout *out)
{
    Layout l;
    long long v, size;
    memset(&l, 0, sizeof l);
#define NUM(name, field)                  \
    if (get_ll(ns, name, &v) < 0)         \
        return -1;                        \
    l.field = v;
    NUM("ALIGN", align) NUM("T_ENTER", t_enter) NUM("T_DONE", t_done) NUM("AUX_PAYLOAD", aux_payload)
    NUM("E_P2P", e_p2p) NUM("E_RECV", e_recv) NUM("E_SAME_OUT", e_same_out)
#undef NUM
    PyObject *key = PyObject_GetAttrString(ns, "SEQ_KEY");
    if (key == NULL)
        return -1;
    l.seq_key = PyLong_AsUnsignedLongLong(key);
    Py_DECREF(key);
    if (PyErr_Occurred())
        return -1;
    if (l.align < 16 || (l.align & (l.align - 1)))
        return layout_error("ALIGN is not a power of two of at least 16");
    if (same_format(ns, "HEAD", "<IBBH") < 0 || same_format(ns, "PAYLOAD_HEAD", "<HBBI") < 0
        || same_format(ns, "ONE_BYTES", "<HBBII") < 0)
        return -1;
    l.one_bytes = 12;
    /* ENTER: its fields, and the call id's among them */
    PyObject *fmt = get_struct(ns, "ENTER_BODY", &size);
    if (fmt == NULL)
        return -1;
    const char *text = PyUnicode_AsUTF8(fmt);
    int rc = text == NULL ? -1 : parse_fields(text, l.enter, MAX_FIELDS, &l.enter_n, &l.enter_body, &l.enter_pads);
    Py_DECREF(fmt);
    if (rc < 0)
        return -1;
    if (l.enter_body != size)
        return layout_error("ENTER_BODY's size is not its fields'");
    long long cid_at;
    if (get_ll(ns, "CID_AT", &cid_at) < 0)
        return -1;
    l.enter_cid = -1;
    for (int i = 0; i < l.enter_n; i++)
        if (l.enter[i].off == cid_at)
            l.enter_cid = i;
    if (l.enter_cid < 0 || l.enter[l.enter_cid].code != 'Q')
        return layout_error("CID_AT is not where a u64 field of ENTER_BODY lies");
    for (int i = 0, k = 0; i < l.enter_n; i++)
        if (i != l.enter_cid)
            l.enter_args[k++] = l.enter[i];
    l.enter_cid_off = (int)cid_at;
    if ((fmt = get_struct(ns, "ENTER", &l.enter_size)) == NULL)
        return -1;
    Py_DECREF(fmt);
    if (l.enter_size != ((l.enter_body + 8 + l.align - 1) & ~(l.align - 1)))
        return layout_error("ENTER is not ENTER_BODY, then zeros to the ALIGN before its last 8 bytes (the seq)");
    /* DONE: six fields */
    Field done[MAX_FIELDS];
    int done_n;
    if ((fmt = get_struct(ns, "DONE_BODY", &size)) == NULL)
        return -1;
    text = PyUnicode_AsUTF8(fmt);
    rc = text == NULL ? -1 : parse_fields(text, done, MAX_FIELDS, &done_n, &l.done_body, &l.done_pads);
    Py_DECREF(fmt);
    if (rc < 0)
        return -1;
    if (done_n != 6 || l.done_body != size || done[0].code != 'Q')
        return layout_error("DONE_BODY's fields are not (call id u64, end, issued, peer, a zero, call seq)");
    memcpy(l.done, done, sizeof l.done);
    if ((fmt = get_struct(ns, "DONE", &l.done_size)) == NULL)
        return -1;
    Py_DECREF(fmt);
    if (l.done_size != ((l.done_body + 8 + l.align - 1) & ~(l.align - 1)))
        return layout_error("DONE is not DONE_BODY, then zeros to the ALIGN before its last 8 bytes (the seq)");
    *out = l;
    return 0;
}

/* The layout of format/calllog.py, read once (by the first Cursor: its module is whole by then). */
static int
ensure_layout(void)
{
    if (layout_loaded)
        return 0;
    PyObject *m = PyImport_ImportModule("prism_rr.format.calllog");
    if (m == NULL)
        return -1;
    int rc = read_layout(m, &L);
    Py_DECREF(m);
    if (rc == 0)
        layout_loaded = 1;
    return rc;
}

/* entry_layout([ns]): the layout as this module writes it, read from `ns` (format/calllog.py
 * by default) without taking it: {"enter": [(offset, code), ...], "cid": index, "done":
 * [...], sizes}. Raises where it cannot write it. */
static PyObject *
entry_layout(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Layout l;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "entry_layout([namespace])");
        return NULL;
    }
    if (nargs == 0) {
        if (ensure_layout() < 0)
            return NULL;
        l = L;
    } else if (read_layout(args[0], &l) < 0) {
        return NULL;
    }
    PyObject *enter = PyList_New(l.enter_n), *done = PyList_New(6);
    for (int i = 0; enter != NULL && done != NULL && i < l.enter_n; i++)
        PyList_SET_ITEM(enter, i, Py_BuildValue("(iC)", l.enter[i].off, l.enter[i].code));
    for (int i = 0; enter != NULL && done != NULL && i < 6; i++)
        PyList_SET_ITEM(done, i, Py_BuildValue("(iC)", l.done[i].off, l.done[i].code));
    if (enter == NULL || done == NULL || PyErr_Occurred()) {
        Py_XDECREF(enter);
        Py_XDECREF(done);
        return NULL;
    }
    return Py_BuildValue("{sNsisNsLsLsLsL}", "enter", enter, "cid", l.enter_cid, "done", done, "enter_body",
                         l.enter_body, "enter_size", l.enter_size, "done_body", l.done_body, "done_size", l.done_size);
}

/* Store x in field f; nonzero where the field does not hold it (struct.pack_into would
 * raise: the caller writes nothing and leaves it to the slow path, Python's, which raises
 * as struct does). All 8 bytes at its offset, x masked to its width: the zeros past it are
 * covered by the next field's store (fields are stored in order), are padding (zeros), or
 * lie where the payload or the entry's end is written after; an entry is at least 8 bytes
 * longer than its body. One store and one compare, no branch on the field's code. */
static inline int
put_field(char *e, const Field *f, long long x)
{
    put_u64(e + f->off, (uint64_t)x & f->mask);
    return (uint64_t)x - f->lo > f->span;
}

static int
Cursor_init(Cursor *self, PyObject *args, PyObject *kwds)
{
    PyObject *buffer, *open;
    long long ring_at, ring_size;
    if (!PyArg_ParseTuple(args, "OLLO", &buffer, &ring_at, &ring_size, &open))
        return -1;
    if (ensure_layout() < 0)
        return -1;
    if (open != Py_None && !PyDict_Check(open)) {
        PyErr_SetString(PyExc_TypeError, "open: a dict, or None");
        return -1;
    }
    if (ring_size < 16 || (ring_size & (ring_size - 1))) {
        PyErr_SetString(PyExc_ValueError, "ring size is not a power of two");
        return -1;
    }
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    if (ring_at < 0 || ring_at + ring_size > self->view.len) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        PyErr_SetString(PyExc_ValueError, "the ring lies outside the buffer");
        return -1;
    }
    self->ring = (char *)self->view.buf + ring_at;
    self->ring_at = ring_at;
    self->ring_size = ring_size;
    self->head = 0;
    self->tail = 0;
    self->tail_seq = 1;
    self->seq = 0;
    self->busy = 0;
    self->has_last = 0;
    Py_XSETREF(self->open, open == Py_None ? NULL : Py_NewRef(open));
    return 0;
}

static void
Cursor_dealloc(Cursor *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_XDECREF(self->open);
    Py_XDECREF(self->slow_enter);
    Py_XDECREF(self->slow_done);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Cursor_release(Cursor *self, PyObject *unused)
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        self->ring = NULL;
    }
    Py_RETURN_NONE;
}

/* Room for an entry of n bytes at head, contiguous, without dropping anything: its offset
 * in the ring, or -1 (the slow path). */
static inline long long
room(Cursor *self, long long n)
{
    if (self->busy || self->ring == NULL)
        return -1;
    long long at = self->head & (self->ring_size - 1);
    if (at + n > self->ring_size || self->head + n - self->tail > self->ring_size)
        return -1;
    return at;
}

/* The payload part an entry carries: a bytes-like object, one tensor's bytes from memory
 * (ptr, nbytes, what), or several tensors' [what, ptr, nbytes, ptr, nbytes, ...] (the
 * layout of payload_tail with datas, format/calllog.py). Its length, or -1 with none. */
typedef struct {
    Py_buffer buf;
    int has_buf;
    const char *ptr;
    long long nbytes;
    int what;
    PyObject *list; /* several tensors' bytes: [what, address, nbytes, ...] (borrowed) */
    Py_ssize_t count;
} Payload;

static int
payload_parse(PyObject *payload, Payload *p, long long *len)
{
    p->has_buf = 0;
    p->ptr = NULL;
    p->list = NULL;
    *len = -1;
    if (payload == NULL || payload == Py_None)
        return 0;
    if (PyList_CheckExact(payload)) { /* [what, address, nbytes, ...]: tensors' bytes in memory */
        Py_ssize_t m = PyList_GET_SIZE(payload);
        if (m < 1 || (m - 1) % 2 || (m - 1) / 2 > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "tensors' bytes: [what, address, nbytes, ...], at most 65535");
            return -1;
        }
        long long total = 0;
        for (Py_ssize_t i = 0; i < m; i++) {
            if (!PyLong_CheckExact(PyList_GET_ITEM(payload, i))) { /* no __index__ run between two reads */
                PyErr_SetString(PyExc_TypeError, "tensors' bytes: [what, address, nbytes, ...] of ints");
                return -1;
            }
        }
        for (Py_ssize_t i = 1; i < m; i += 2) {
            const void *ptr = PyLong_AsVoidPtr(PyList_GET_ITEM(payload, i));
            long long k = PyLong_AsLongLong(PyList_GET_ITEM(payload, i + 1));
            if (PyErr_Occurred())
                return -1;
            if (k < 0 || k > 0xFFFFFFFFLL || (ptr == NULL && k)) {
                PyErr_SetString(PyExc_ValueError, "tensors' bytes: bad address or length");
                return -1;
            }
            total += k;
        }
        if (total > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "tensors' bytes: too many");
            return -1;
        }
        p->what = (int)PyLong_AsLong(PyList_GET_ITEM(payload, 0));
        if (PyErr_Occurred())
            return -1;
        p->list = payload;
        p->count = (m - 1) / 2;
        p->nbytes = total;
        *len = 8 + 4 * p->count + total;
        return 0;
    }
    if (PyTuple_Check(payload)) { /* (address, nbytes, what): one tensor's bytes in memory */
        if (PyTuple_GET_SIZE(payload) != 3) {
            PyErr_SetString(PyExc_TypeError, "a tensor's bytes: (address, nbytes, what)");
            return -1;
        }
        p->ptr = (const char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(payload, 0));
        p->nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(payload, 1));
        p->what = (int)PyLong_AsLong(PyTuple_GET_ITEM(payload, 2));
        if (PyErr_Occurred())
            return -1;
        if (p->nbytes < 0 || p->nbytes > 0xFFFFFFFFLL || (p->ptr == NULL && p->nbytes)) {
            PyErr_SetString(PyExc_ValueError, "a tensor's bytes: bad address or length");
            return -1;
        }
        *len = L.one_bytes + p->nbytes;
        return 0;
    }
    if (PyObject_GetBuffer(payload, &p->buf, PyBUF_SIMPLE) < 0)
        return -1;
    p->has_buf = 1;
    *len = p->buf.len;
    return 0;
}

static void
payload_write(char *dst, Payload *p)
{
    if (p->has_buf) {
        memcpy(dst, p->buf.buf, p->buf.len);
        return;
    }
    if (p->list != NULL) { /* checked by payload_parse */
        put_u16(dst, (uint16_t)p->count);
        dst[2] = (char)p->what;
        dst[3] = 0;
        put_u32(dst + 4, (uint32_t)p->nbytes);
        char *lens = dst + 8, *data = dst + 8 + 4 * p->count;
        for (Py_ssize_t i = 0; i < p->count; i++) {
            const char *ptr = (const char *)PyLong_AsVoidPtr(PyList_GET_ITEM(p->list, 1 + 2 * i));
            long long k = PyLong_AsLongLong(PyList_GET_ITEM(p->list, 2 + 2 * i));
            put_u32(lens + 4 * i, (uint32_t)k);
            if (k) {
                memcpy(data, ptr, (size_t)k);
                data += k;
            }
        }
        return;
    }
    put_u16(dst, 1);
    dst[2] = (char)p->what;
    dst[3] = 0;
    put_u32(dst + 4, (uint32_t)p->nbytes);
    put_u32(dst + 8, (uint32_t)p->nbytes);
    if (p->nbytes)
        memcpy(dst + L.one_bytes, p->ptr, (size_t)p->nbytes);
}

static void
payload_done(Payload *p)
{
    if (p->has_buf)
        PyBuffer_Release(&p->buf);
}

/* The entry's padding (zeros) and its seq: stored last. */
static inline void
commit(char *e, long long n, long long used, uint64_t seq)
{
    if (n - 8 > used)
        memset(e + used, 0, (size_t)(n - 8 - used));
    put_u64(e + n - 8, seq ^ L.seq_key);
}

static int
put_open(Cursor *self, long long cid, long long pos)
{
    PyObject *k = PyLong_FromLongLong(cid), *v = PyLong_FromLongLong(pos);
    int rc = (k && v) ? PyDict_SetItem(self->open, k, v) : -1;
    Py_XDECREF(k);
    Py_XDECREF(v);
    return rc;
}

/* The newest call entered into `open` (before Python reads it): 0, or -1 on an error. */
static int
flush_open(Cursor *self)
{
    if (self->open == NULL || !self->has_last)
        return 0;
    self->has_last = 0;
    return put_open(self, self->last_cid, self->last_pos);
}

static int
set_open(Cursor *self, long long cid, long long pos)
{
    if (self->open == NULL)
        return 0;
    if (flush_open(self) < 0)
        return -1;
    self->last_cid = cid;
    self->last_pos = pos;
    self->has_last = 1;
    return 0;
}

static int
pop_open(Cursor *self, long long cid)
{
    if (self->open == NULL)
        return 0;
    if (self->has_last && self->last_cid == cid) {
        self->has_last = 0;
        return 0;
    }
    PyObject *k = PyLong_FromLongLong(cid);
    if (k == NULL)
        return -1;
    int rc = PyDict_DelItem(self->open, k);
    Py_DECREF(k);
    if (rc < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
        PyErr_Clear();
        rc = 0;
    }
    return rc;
}

/* An int argument; an overflow is an error as PyLong_AsLongLong's (whose way through a
 * timestamp, an int of several digits, is a byte-array conversion, this one a loop). */
static inline long long
as_ll(PyObject *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    return x;
}

#define ARG_LL(i, var) long long var = as_ll(args[i])

/* Write an ENTER here: its call id; -1 where it needs the slow path (no room, busy, or a
 * value its field cannot hold); -3 on an error. `v`: enter's arguments but the payload
 * (flags, then the fields but the call id, in order); `payload`: as enter's. */
static long long
write_enter(Cursor *self, const long long *v, PyObject *payload)
{
    Payload p;
    long long plen;
    if (payload_parse(payload, &p, &plen) < 0)
        return -3;
    long long n = plen < 0 ? L.enter_size : ((L.enter_body + plen + 8 + L.align - 1) & ~(L.align - 1));
    long long at = room(self, n);
    if (at < 0 || v[0] < 0 || v[0] > UINT8_MAX) {
        payload_done(&p);
        return -1;
    }
    long long pos = self->head, seq = self->seq + 1;
    char *e = self->ring + at;
    if (L.enter_pads)
        memset(e + 8, 0, (size_t)(L.enter_body - 8));
    put_u32(e, (uint32_t)n);
    e[4] = (char)L.t_enter;
    e[5] = (char)v[0];
    put_u16(e + 6, plen < 0 ? 0 : (uint16_t)L.aux_payload);
    int bad = 0;
    for (int i = 0, n_args = L.enter_n - 1; i < n_args; i++)
        bad |= put_field(e, &L.enter_args[i], v[i + 1]);
    if (bad) {
        payload_done(&p);
        return -1; /* nothing is committed: the slow path raises as struct does */
    }
    put_u64(e + L.enter_cid_off, (uint64_t)seq); /* after the field before it, whose zeros reach it */
    long long used = L.enter_body;
    if (plen >= 0) {
        payload_write(e + L.enter_body, &p);
        used += plen;
    }
    payload_done(&p);
    commit(e, n, used, (uint64_t)seq);
    self->seq = seq;
    self->head = pos + n;
    if (set_open(self, seq, pos) < 0)
        return -3;
    return seq;
}

/* Write a DONE here: 0; -1 where it needs the slow path (as write_enter's); -3 on an error. */
static int
write_done(Cursor *self, long long cid, long long end, long long issued, long long flags, long long peer,
           long long call_seq, PyObject *payload)
{
    Payload p;
    long long plen;
    if (payload_parse(payload, &p, &plen) < 0)
        return -3;
    long long n = plen < 0 ? L.done_size : ((L.done_body + plen + 8 + L.align - 1) & ~(L.align - 1));
    long long at = cid < 0 ? -1 : room(self, n); /* a call whose ENTER was dropped: the slow path counts it */
    if (at < 0 || flags < 0 || flags > UINT8_MAX) {
        payload_done(&p);
        return -1;
    }
    long long seq = self->seq + 1;
    char *e = self->ring + at;
    if (L.done_pads)
        memset(e + 8, 0, (size_t)(L.done_body - 8));
    put_u32(e, (uint32_t)n);
    e[4] = (char)L.t_done;
    e[5] = (char)flags;
    put_u16(e + 6, plen < 0 ? 0 : (uint16_t)L.aux_payload);
    int bad = put_field(e, &L.done[0], cid); /* in field order: see put_field */
    bad |= put_field(e, &L.done[1], end);
    bad |= put_field(e, &L.done[2], issued);
    bad |= put_field(e, &L.done[3], peer);
    bad |= put_field(e, &L.done[4], 0);
    bad |= put_field(e, &L.done[5], call_seq);
    if (bad) {
        payload_done(&p);
        return -1;
    }
    long long used = L.done_body;
    if (plen >= 0) {
        payload_write(e + L.done_body, &p);
        used += plen;
    }
    payload_done(&p);
    commit(e, n, used, (uint64_t)seq);
    self->seq = seq;
    self->head += n;
    if (pop_open(self, cid) < 0)
        return -3;
    return 0;
}

/* enter(flags, <the ENTER's fields but the call id, in order>[, payload]) -> call id (as
 * CallLog._enter: flags, start, prev, step, group, call_seq, peer, tag, in_desc, out_desc,
 * stack, op, reduce_op, mem_alloc, mem_peak, as format/calllog.py lays them out today).
 * payload: None, bytes, or (address, nbytes, what): one tensor's bytes to copy from memory. */
static PyObject *
Cursor_enter(Cursor *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != ENTER_ARGS && nargs != ENTER_ARGS + 1) {
        PyErr_Format(PyExc_TypeError, "enter takes %d or %d arguments (the call log's ENTER)", ENTER_ARGS,
                     ENTER_ARGS + 1);
        return NULL;
    }
    long long v[MAX_FIELDS];
    for (int i = 0; i < ENTER_ARGS; i++)
        v[i] = as_ll(args[i]);
    long long cid = -1; /* an int no field holds: the slow path's, which struct refuses */
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
    } else {
        cid = write_enter(self, v, nargs > ENTER_ARGS ? args[ENTER_ARGS] : NULL);
    }
    if (cid == -3)
        return NULL;
    if (cid == -1) {
        if (self->slow_enter == NULL || self->slow_enter == Py_None)
            return PyLong_FromLong(-2);
        return PyObject_Vectorcall(self->slow_enter, args, nargs, NULL);
    }
    return PyLong_FromLongLong(cid);
}

/* done(cid, end, issued[, flags[, peer[, call_seq[, payload]]]]) -> 0 (payload: as enter's) */
static PyObject *
Cursor_done(Cursor *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError, "done takes 3 to 7 arguments");
        return NULL;
    }
    ARG_LL(0, cid); ARG_LL(1, end); ARG_LL(2, issued);
    long long flags = nargs > 3 ? as_ll(args[3]) : 0;
    long long peer = nargs > 4 ? as_ll(args[4]) : -1;
    long long call_seq = nargs > 5 ? as_ll(args[5]) : -1;
    int rc = -1; /* an int no field holds: the slow path's, which struct refuses */
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
    } else {
        rc = write_done(self, cid, end, issued, flags, peer, call_seq, nargs > 6 ? args[6] : NULL);
    }
    if (rc == -3)
        return NULL;
    if (rc == -1) {
        if (self->slow_done == NULL || self->slow_done == Py_None)
            return PyLong_FromLong(-2);
        return PyObject_Vectorcall(self->slow_done, args, nargs, NULL);
    }
    return PyLong_FromLong(0);
}

static PyObject *
Cursor_state(Cursor *self, PyObject *unused)
{
    return Py_BuildValue("(LLLL)", self->head, self->tail, self->tail_seq, self->seq);
}

/* skip(tail, until, seq) -> (tail, seq): past the whole entries from ring position `tail`
 * (its entry's seq `seq`) while before `until` and the head (a flight ring's oldest entries,
 * to drop: CallLog._drop_until). */
static PyObject *
Cursor_skip(Cursor *self, PyObject *args)
{
    long long tail, until, seq;
    if (!PyArg_ParseTuple(args, "LLL", &tail, &until, &seq))
        return NULL;
    if (self->ring == NULL) {
        PyErr_SetString(PyExc_ValueError, "the call log is closed");
        return NULL;
    }
    long long mask = self->ring_size - 1;
    while (tail < until && tail < self->head) {
        uint32_t n;
        memcpy(&n, self->ring + (tail & mask), 4);
        if (n < 16 || (n & 15) || n > self->ring_size) {
            PyErr_Format(PyExc_ValueError, "the call log's ring: an entry of %u bytes at %lld", n, tail);
            return NULL;
        }
        tail += n;
        seq += 1;
    }
    return Py_BuildValue("LL", tail, seq);
}

static PyObject *
Cursor_flush_open(Cursor *self, PyObject *unused)
{
    if (flush_open(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Cursor_methods[] = {
    {"flush_open", (PyCFunction)Cursor_flush_open, METH_NOARGS,
     "Put the newest call entered into the open table (before Python reads it)."},
    {"skip", (PyCFunction)Cursor_skip, METH_VARARGS, "skip(tail, until, seq) -> (tail, seq): past whole entries"},
    {"enter", (PyCFunction)(void (*)(void))Cursor_enter, METH_FASTCALL, "Write an ENTER; its call id, or -2."},
    {"done", (PyCFunction)(void (*)(void))Cursor_done, METH_FASTCALL, "Write a DONE; 0, or -2."},
    {"state", (PyCFunction)Cursor_state, METH_NOARGS, "(head, tail, tail_seq, seq)"},
    {"release", (PyCFunction)Cursor_release, METH_NOARGS, "Let go of the buffer."},
    {NULL}
};

static PyMemberDef Cursor_members[] = {
    {"head", T_LONGLONG, offsetof(Cursor, head), 0, "absolute ring position of the next entry"},
    {"tail", T_LONGLONG, offsetof(Cursor, tail), 0, "of the oldest entry a reader must read"},
    {"tail_seq", T_LONGLONG, offsetof(Cursor, tail_seq), 0, "the seq of the entry at tail"},
    {"seq", T_LONGLONG, offsetof(Cursor, seq), 0, "of the last entry written"},
    {"busy", T_INT, offsetof(Cursor, busy), 0, "the slow path holds the ring: the fast one stands aside"},
    {"slow_enter", T_OBJECT, offsetof(Cursor, slow_enter), 0, "called with enter's arguments when it cannot write"},
    {"slow_done", T_OBJECT, offsetof(Cursor, slow_done), 0, "called with done's arguments when it cannot write"},
    {NULL}
};

static PyTypeObject CursorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prism_rr._speedups.Cursor",
    .tp_basicsize = sizeof(Cursor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Cursor(buffer, ring_at, ring_size, open): a call log ring's writing position (open: a dict of the calls open, or None).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cursor_init,
    .tp_dealloc = (destructor)Cursor_dealloc,
    .tp_methods = Cursor_methods,
    .tp_members = Cursor_members,
};

/* One frame of the caller's stack: its code (borrowed) and its last instruction's offset
 * in bytes (frame.f_lasti). Frames are walked outwards, from the caller of `stack`. */
#ifdef PRISM_RR_RAW_FRAMES
typedef _PyInterpreterFrame *FrameRef;

static _PyInterpreterFrame *
complete(_PyInterpreterFrame *f)
{
    /* as PyFrame_GetBack and sys._getframe: a frame still being set up is not one yet */
    while (f != NULL && _PyFrame_IsIncomplete(f))
        f = f->previous;
    return f;
}

static FrameRef frame_first(void) { return complete(PyThreadState_Get()->cframe->current_frame); }
static FrameRef frame_back(FrameRef f) { return complete(f->previous); }
static void frame_done(FrameRef f) { (void)f; }
static PyCodeObject *frame_code(FrameRef f) { return f->f_code; }
static int
frame_lasti(FrameRef f)
{
    int lasti = _PyInterpreterFrame_LASTI(f);
    return lasti < 0 ? -1 : lasti * (int)sizeof(_Py_CODEUNIT);
}
#else
typedef PyFrameObject *FrameRef; /* a new reference */

static FrameRef
frame_first(void)
{
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    return f;
}

static FrameRef
frame_back(FrameRef f)
{
    PyFrameObject *back = PyFrame_GetBack(f);
    Py_DECREF(f);
    return back;
}

static void frame_done(FrameRef f) { Py_XDECREF(f); }

static PyCodeObject *
frame_code(FrameRef f)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    Py_DECREF(code); /* alive: the frame holds it */
    return code;
}

static int frame_lasti(FrameRef f) { return PyFrame_GetLasti(f); }
#endif

/* The walk's own caches, filled from the Python caches it is given: a frame (its code and
 * offset) -> its text, or None for a frame that is not the user's; a stack (its texts) ->
 * the stack interned in `stacks`. Python dicts keyed by id(code) cost a few hundred
 * instructions a lookup (ids are aligned: their hashes crowd). Each entry holds its own
 * references, so a pointer in it is never another object's. */
#define FRAME_SLOTS 1024
#define STACK_SLOTS 256
#define STACK_MAX 8

typedef struct {
    PyObject *code;
    int lasti;
    PyObject *text;
} FrameSlot;

typedef struct {
    int n;
    PyObject *texts[STACK_MAX];
    PyObject *stack;
} StackSlot;

static FrameSlot frame_slots[FRAME_SLOTS];
static StackSlot stack_slots[STACK_SLOTS];

static inline size_t
mix(uint64_t h, int bits)
{
    return (size_t)((h * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

/* The frame's text (borrowed), Py_None for a frame that is not the user's, NULL with no
 * error on a miss of the Python caches, NULL with an error on an error. */
static PyObject *
frame_text(PyCodeObject *code, int lasti, PyObject *is_user, PyObject *texts)
{
    FrameSlot *slot = &frame_slots[mix(((uint64_t)(uintptr_t)code >> 4) ^ ((uint64_t)(uint32_t)lasti << 40), 10)];
    if (slot->code == (PyObject *)code && slot->lasti == lasti)
        return slot->text;
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return NULL;
    PyObject *known = PyDict_GetItemWithError(is_user, key); /* borrowed: (code, bool) */
    if (known == NULL || !PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 2) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *text = Py_None;
    if (PyTuple_GET_ITEM(known, 1) == Py_True) {
        PyObject *off = PyLong_FromLong(lasti);
        PyObject *tkey = off ? PyTuple_Pack(2, key, off) : NULL;
        Py_XDECREF(off);
        Py_DECREF(key);
        if (tkey == NULL)
            return NULL;
        text = PyDict_GetItemWithError(texts, tkey); /* borrowed */
        Py_DECREF(tkey);
        if (text == NULL)
            return NULL;
    } else {
        Py_DECREF(key);
    }
    PyObject *old_code = slot->code, *old_text = slot->text;
    slot->code = Py_NewRef((PyObject *)code);
    slot->lasti = lasti;
    slot->text = Py_NewRef(text);
    Py_XDECREF(old_code);
    Py_XDECREF(old_text);
    return text;
}

/* The stack of these texts (a new reference): interned in `stacks`; False where it is
 * not there yet (the Python walk interns it); NULL on an error. */
static PyObject *
stack_of(PyObject **out, int n, PyObject *stacks)
{
    StackSlot *slot = NULL;
    if (n <= STACK_MAX) {
        uint64_t h = (uint64_t)n;
        for (int i = 0; i < n; i++)
            h = (h ^ ((uint64_t)(uintptr_t)out[i] >> 4)) * 0x100000001B3ULL;
        slot = &stack_slots[mix(h, 8)];
        if (slot->n == n && slot->stack != NULL) {
            int same = 1;
            for (int i = 0; i < n && same; i++)
                same = slot->texts[i] == out[i];
            if (same)
                return Py_NewRef(slot->stack);
        }
    }
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(out[i]));
    PyObject *result = PyDict_GetItemWithError(stacks, t); /* borrowed */
    Py_DECREF(t);
    if (result == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE; /* a new stack: interned by the Python walk */
    }
    if (slot != NULL) {
        PyObject *old[STACK_MAX + 1];
        int m = slot->n;
        for (int i = 0; i < m; i++)
            old[i] = slot->texts[i];
        old[m] = slot->stack;
        for (int i = 0; i < n; i++)
            slot->texts[i] = Py_NewRef(out[i]);
        slot->n = n;
        slot->stack = Py_NewRef(result);
        for (int i = 0; i <= m; i++)
            Py_XDECREF(old[i]);
    }
    return Py_NewRef(result);
}

/* caller_stack from its caches (a new reference): a tuple of texts (interned in `stacks`),
 * () when no frame is user code, False on a cache miss; NULL on an error. skip: frames
 * above the current Python frame (the caller of the C function). */
static PyObject *
stack_walk(long depth, long skip, PyObject *is_user, PyObject *texts, PyObject *stacks)
{
#if PY_VERSION_HEX < 0x030B0000
    Py_RETURN_FALSE;
#else
    if (depth > 64)
        depth = 64;
    FrameRef frame = frame_first();
    for (long i = 0; i < skip && frame != NULL; i++)
        frame = frame_back(frame);
    PyObject *out[64]; /* borrowed: the caches hold them */
    int n = 0, hops = 0;
    while (frame != NULL && hops < 64 && n < depth) {
        PyObject *text = frame_text(frame_code(frame), frame_lasti(frame), is_user, texts);
        if (text == NULL) {
            frame_done(frame);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_FALSE; /* a frame not seen before: the Python walk learns it */
        }
        if (text != Py_None)
            out[n++] = text;
        frame = frame_back(frame);
        hops++;
    }
    frame_done(frame);
    if (n == 0)
        return PyTuple_New(0);
    return stack_of(out, n, stacks);
#endif
}

/* stack(depth, skip, is_user, texts, stacks): caller_stack from its caches (stack_walk);
 * skip: frames above the caller of this function. */
static PyObject *
stack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_Check(args[2]) || !PyDict_Check(args[3]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "stack(depth, skip, is_user, texts, stacks)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[0]), skip = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    return stack_walk(depth, skip, args[2], args[3], args[4]);
}

/* --- CallState: the recorder's state for one rank's calls, and its blocking call path --
 *
 * The base of recorder/_calls.py's CallRecorder (where the speedups were built; `object`
 * elsewhere): its hot attributes are this struct's members, which the Python code reads
 * and writes as attributes, and `fast_blocking` runs CallRecorder.blocking's common case
 * in C (a blocking call on a group whose recording needs nothing but the call log: no
 * memory readings, device clock, payloads read later, per-operator mode or memory
 * tracker, no call open or finished, every name, shape and stack seen before). Anything
 * else goes to the Python path (`_blocking_py`), before anything is written; the entries
 * written are the same, field for field, written by the same Cursor code. */

/* --- what the blocking path is bound to (`bind`, once, by recorder/_calls.py) ---------
 *
 * Call (intercept/group.py): the slots this code reads or sets, found by name; and every
 * slot of a prototype, Call(...) as its __init__ leaves it, which a Call made here starts
 * from (fast_collective), so a slot Call gains, or a default it changes, needs nothing here.
 * enter's arguments (CallLog._enter's, by name): where each value the blocking path
 * writes goes among them. A slot or an argument this code needs and does not find, or an
 * argument it has no value for, is refused by name where it is bound. */
enum { C_OP, C_GID, C_SEQ, C_INS, C_OUTS, C_FN, C_ARGS, C_REDUCE_OP, C_ROOT, C_PEER, C_TAG, C_ASYNC, C_P2P,
       C_RECEIVES, C_CID, C_START, C_STEP, C_ISSUED, C_DONE, C_SLOTS };
static const char *call_slot_names[C_SLOTS] = {
    "op", "gid", "seq", "ins", "outs", "fn", "args", "reduce_op", "root", "peer", "tag", "async_op", "p2p",
    "receives", "cid", "start", "step", "issued", "done"};
static PyTypeObject *call_type = NULL;
static Py_ssize_t call_offsets[C_SLOTS];
static PyObject *call_proto = NULL;      /* Call(...) as __init__ leaves it */
static Py_ssize_t proto_offsets[64];     /* every slot of Call */
static int proto_n = 0;

enum { A_FLAGS, A_START, A_PREV, A_STEP, A_GROUP, A_CALL_SEQ, A_PEER, A_TAG, A_IN_DESC, A_OUT_DESC, A_STACK, A_OP,
       A_REDUCE_OP, A_MEM_ALLOC, A_MEM_PEAK, A_N };
static const char *arg_names[A_N] = {
    "flags", "start", "prev", "step", "group", "call_seq", "peer", "tag", "in_desc", "out_desc", "stack", "op",
    "reduce_op", "mem_alloc", "mem_peak"};
static int arg_at[A_N];                  /* where each is among enter's arguments */
static int full_mode = -1;               /* intercept/payload.py's FULL: the Python path's */

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + call_offsets[i]))

static inline void
slot_set(PyObject *obj, int i, PyObject *value) /* steals `value` */
{
    PyObject **at = &SLOT(obj, i);
    PyObject *old = *at;
    *at = value;
    Py_XDECREF(old);
}

static int
bind_error(const char *fmt, const char *name)
{
    PyErr_Format(PyExc_ValueError, fmt, name);
    return -1;
}

static int
bind_call(PyTypeObject *cls, PyObject *proto)
{
    if (cls->tp_base != &PyBaseObject_Type || cls->tp_dictoffset != 0 || cls->tp_members == NULL)
        return bind_error("bind: %s is not a class of slots only, on object", cls->tp_name);
    if (Py_TYPE(proto) != cls)
        return bind_error("bind: the prototype is not a %s", cls->tp_name);
    Py_ssize_t offsets[C_SLOTS];
    for (int i = 0; i < C_SLOTS; i++) {
        PyObject *d = PyDict_GetItemString(cls->tp_dict, call_slot_names[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
            return bind_error("bind: Call has no slot %s, which the blocking path in C sets or reads "
                              "(prism_rr/_speedups.c, call_slot_names)", call_slot_names[i]);
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            return bind_error("bind: %s is not an object slot", call_slot_names[i]);
        offsets[i] = m->offset;
    }
    int n = 0;
    for (PyMemberDef *m = cls->tp_members; m->name != NULL; m++) {
        if (m->type != T_OBJECT_EX || n == 64)
            return bind_error("bind: Call's slot %s is not an object slot (or one of too many)", m->name);
        int given = 0; /* fast_collective's nine, set from its arguments */
        for (int i = C_OP; i <= C_ROOT; i++)
            given |= offsets[i] == m->offset;
        if (!given)
            proto_offsets[n++] = m->offset;
    }
    memcpy(call_offsets, offsets, sizeof offsets);
    proto_n = n;
    Py_XSETREF(call_proto, Py_NewRef(proto));
    Py_XSETREF(call_type, (PyTypeObject *)Py_NewRef((PyObject *)cls));
    return 0;
}

static int
bind_args(PyObject *names, int *out)
{
    PyObject *seq = PySequence_Fast(names, "bind: enter's arguments, a sequence of names");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int at[A_N], rc = -1;
    for (int i = 0; i < A_N; i++)
        at[i] = -1;
    if (n != ENTER_ARGS) {
        PyErr_Format(PyExc_ValueError, "bind: enter takes %zd arguments but the call log's ENTER has %d "
                     "(format/calllog.py: flags, then ENTER_BODY's fields but the call id)", n, ENTER_ARGS);
        goto out;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, k));
        if (name == NULL)
            goto out;
        int i = 0;
        while (i < A_N && strcmp(arg_names[i], name) != 0)
            i++;
        if (i == A_N) {
            bind_error("bind: the call log's ENTER has a field %s that the blocking path in C has no value for "
                       "(prism_rr/_speedups.c, arg_names and blocking_held)", name);
            goto out;
        }
        at[i] = (int)k;
    }
    for (int i = 0; i < A_N; i++)
        if (at[i] < 0) {
            bind_error("bind: the call log's ENTER has no field %s, which the blocking path in C writes "
                       "(prism_rr/_speedups.c, arg_names)", arg_names[i]);
            goto out;
        }
    memcpy(out, at, sizeof at);
    rc = 0;
out:
    Py_DECREF(seq);
    return rc;
}

/* bind(Call, prototype, enter_args, full): see above; `full` is the payload mode that the
 * Python path keeps for itself. */
static PyObject *
bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind(Call, prototype, enter_args, full)");
        return NULL;
    }
    long full = PyLong_AsLong(args[3]);
    if (full == -1 && PyErr_Occurred())
        return NULL;
    int at[A_N];
    if (ensure_layout() < 0 || bind_args(args[2], at) < 0 || bind_call((PyTypeObject *)args[0], args[1]) < 0)
        return NULL; /* nothing taken: bind_call takes the Call last, once all is checked */
    memcpy(arg_at, at, sizeof at);
    full_mode = (int)full;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *rec, *open, *finished, *later, *memory, *tracker, *ops_mode, *device;
    PyObject *last_return, *step, *descs, *names, *stacks, *graph_task, *task_seen;
    PyObject *cursor;       /* the log's Cursor, or None (a log written by the Python path) */
    PyObject *stack_caches; /* (is_user, texts, stacks) of intercept/stack.py, or None */
    PyObject *log_payload;  /* intercept/payload.log_payload */
    PyObject *done_work;    /* () -> the completed Work a blocking send or recv returns */
    PyObject *op_names;     /* intercept/group.op_names()'s: hash(a ReduceOp) -> its name */
    PyObject *op_name;      /* ... and its function naming any other */
    PyObject *reduce_op_type; /* torch's ReduceOp */
    PyObject *tensor_type;  /* torch.Tensor, for log_payload's small plain tensors (small_payload) */
    PyObject *strided;      /* torch.strided */
    int mode, inputs, stack_depth, small_what;
    long long inline_max, keep_small;
} CallState;

#define CALLSTATE_OBJECTS(X) X(rec) X(open) X(finished) X(later) X(memory) X(tracker) X(ops_mode) X(device) \
    X(last_return) X(step) X(descs) X(names) X(stacks) X(graph_task) X(task_seen) X(cursor) X(stack_caches) \
    X(log_payload) X(done_work) X(op_names) X(op_name) X(reduce_op_type) X(tensor_type) X(strided)

static int
CallState_traverse(CallState *self, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(self->f);
    CALLSTATE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
CallState_clear(CallState *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    CALLSTATE_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
CallState_dealloc(CallState *self)
{
    PyObject_GC_UnTrack(self);
    CallState_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *s_wait, *s_complete, *s_fail, *s_on, *s_settle, *s_blocking_py, *s_shape, *s_dtype;
static PyObject *s_layout, *s_is_cpu, *s_is_contiguous, *s_nbytes, *s_data_ptr;

/* time.monotonic_ns(): on Linux CLOCK_MONOTONIC, which Python reads; elsewhere Python's own. */
static inline long long
now_ns(void)
{
#ifdef __linux__
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#elif PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    return PyTime_MonotonicRaw(&t) < 0 ? 0 : (long long)t;
#else
    return (long long)_PyTime_GetMonotonicClock();
#endif
}

static inline int
is_none(PyObject *o)
{
    return o == NULL || o == Py_None;
}

/* The dictionary id of these tensors' shapes and dtypes (CallRecorder._desc's key): > 0;
 * 0 where it is not there yet; -1 on an error. */
/* (shape, dtype) of one tensor, or NULL (a new reference; the tensor held while its
 * attributes run, which may be Python code: a tensor subclass's). */
static PyObject *
shape_dtype(PyObject *t)
{
    Py_INCREF(t);
    PyObject *shape = PyObject_GetAttr(t, s_shape);
    PyObject *dtype = shape ? PyObject_GetAttr(t, s_dtype) : NULL;
    PyObject *pair = dtype ? PyTuple_Pack(2, shape, dtype) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_DECREF(t);
    return pair;
}

static long long
desc_id(CallState *self, PyObject *tensors)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tensors);
    PyObject *key;
    if (n == 1) {
        key = shape_dtype(PySequence_Fast_GET_ITEM(tensors, 0));
    } else {
        key = PyTuple_New(n);
        for (Py_ssize_t i = 0; key != NULL && i < n; i++) {
            if (PySequence_Fast_GET_SIZE(tensors) != n) { /* a list changed under us: the Python path's */
                Py_DECREF(key);
                return 0;
            }
            PyObject *pair = shape_dtype(PySequence_Fast_GET_ITEM(tensors, i));
            if (pair == NULL)
                Py_CLEAR(key);
            else
                PyTuple_SET_ITEM(key, i, pair);
        }
    }
    if (key == NULL)
        return -1;
    PyObject *got = PyDict_GetItemWithError(self->descs, key);
    Py_DECREF(key);
    if (got == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return as_ll(got);
}

/* names[key]'s id (> 0); 0 where it is not there; -1 on an error. */
static long long
name_id(CallState *self, PyObject *key)
{
    PyObject *got = PyDict_GetItemWithError(self->names, key);
    if (got == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return as_ll(got);
}

/* The pending exception as one object (normalized, its traceback attached); NULL if none. */
static PyObject *
take_error(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

static inline void
give_error(PyObject *value) /* steals `value`: it is the pending exception again */
{
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(value)), value, PyException_GetTraceback(value));
}

/* rec.fail(the pending exception): 0, or -1 with fail's own error pending. */
static int
fail(CallState *self)
{
    PyObject *exc = take_error();
    if (exc == NULL)
        return 0;
    PyObject *r = PyObject_CallMethodOneArg(self->rec, s_fail, exc);
    Py_DECREF(exc);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Whether t is a plain tensor whose bytes the log copies from memory, as log_payload tests
 * it (torch.Tensor itself, strided, on the CPU, contiguous): 1 with its nbytes and address,
 * 0 where it is not, -1 on an error (reading the tensor raised, as in log_payload). */
static int
plain_tensor(CallState *self, PyObject *t, long long *nbytes, PyObject **ptr)
{
    if ((PyObject *)Py_TYPE(t) != self->tensor_type)
        return 0;
    PyObject *v;
    int yes;
#define TEST(expr, cond)       \
    if ((v = (expr)) == NULL)  \
        return -1;             \
    yes = (cond);              \
    Py_DECREF(v);              \
    if (yes <= 0)              \
        return yes;
    TEST(PyObject_GetAttr(t, s_layout), v == self->strided)
    TEST(PyObject_GetAttr(t, s_is_cpu), PyObject_IsTrue(v))
    TEST(PyObject_CallMethodNoArgs(t, s_is_contiguous), PyObject_IsTrue(v))
#undef TEST
    if ((v = PyObject_GetAttr(t, s_nbytes)) == NULL)
        return -1;
    *nbytes = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (*nbytes == -1 && PyErr_Occurred())
        return -1;
    if (*nbytes < 0 || *nbytes > self->keep_small) /* not kept whole: log_payload's to say */
        return 0;
    if ((*ptr = PyObject_CallMethodNoArgs(t, s_data_ptr)) == NULL)
        return -1;
    return 1;
}

/* log_payload's cases of small plain CPU tensors (intercept/payload.py), as it tests them:
 * one tensor of at most KEEP_SMALL bytes as (address, nbytes, what), several of at most
 * KEEP_SMALL bytes in all as [what, address, nbytes, ...], the bytes copied by the log from
 * memory. NULL with no error where the call is none of these (log_payload's to say), NULL
 * with an error where reading a tensor raised (as log_payload would). */
static PyObject *
small_payload(CallState *self, PyObject *tensors)
{
    if (is_none(self->tensor_type) || is_none(self->strided))
        return NULL;
    if (!PyList_CheckExact(tensors) && !PyTuple_CheckExact(tensors))
        return NULL;
    PyObject *seq = Py_NewRef(tensors); /* reading a tensor may run code that changes a list */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    if (count == 1) {
        PyObject *t = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 0)), *ptr = NULL;
        long long n;
        if (plain_tensor(self, t, &n, &ptr) > 0) {
            PyObject *nb = PyLong_FromLongLong(n), *what = PyLong_FromLong(self->small_what);
            if (nb != NULL && what != NULL)
                result = PyTuple_Pack(3, ptr, nb, what);
            Py_DECREF(ptr);
            Py_XDECREF(nb);
            Py_XDECREF(what);
        }
        Py_DECREF(t);
    } else if (count > 1) {
        PyObject *spec = PyList_New(1 + 2 * count);
        long long total = 0;
        Py_ssize_t i = 0;
        if (spec == NULL)
            goto done;
        PyList_SET_ITEM(spec, 0, PyLong_FromLong(self->small_what));
        if (PyList_GET_ITEM(spec, 0) == NULL)
            goto failed;
        for (; i < count && i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *t = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i)), *ptr = NULL;
            long long n;
            int ok = plain_tensor(self, t, &n, &ptr);
            Py_DECREF(t);
            if (ok > 0 && (total += n) > self->keep_small) {
                Py_DECREF(ptr);
                ok = 0;
            }
            if (ok <= 0)
                goto failed;
            PyObject *nb = PyLong_FromLongLong(n);
            if (nb == NULL) {
                Py_DECREF(ptr);
                goto failed;
            }
            PyList_SET_ITEM(spec, 1 + 2 * i, ptr);
            PyList_SET_ITEM(spec, 2 + 2 * i, nb);
        }
        if (i == count) {
            result = spec;
            goto done;
        }
    failed: /* the items not set are NULL, which list_dealloc skips */
        Py_XDECREF(spec);
    }
done:
    Py_DECREF(seq);
    return result;
}

/* log_payload(tensors, mode, None, False, inline_max): a new reference (None included), or NULL. */
static PyObject *
payload_of(CallState *self, PyObject *log_payload, PyObject *tensors)
{
    PyObject *small = small_payload(self, tensors);
    if (small != NULL || PyErr_Occurred())
        return small;
    PyObject *mode = PyLong_FromLong(self->mode), *max = PyLong_FromLongLong(self->inline_max);
    PyObject *r = NULL;
    if (mode != NULL && max != NULL) {
        PyObject *args[5] = {tensors, mode, Py_None, Py_False, max};
        r = PyObject_Vectorcall(log_payload, args, 5, NULL);
    }
    Py_XDECREF(mode);
    Py_XDECREF(max);
    return r;
}

static PyObject *
fallback(CallState *self, PyObject *call)
{
    return PyObject_CallMethodOneArg((PyObject *)self, s_blocking_py, call);
}

/* The call's ENTER through the log's slow path (Python: it makes room, or drops): its id. */
static long long
slow_enter(Cursor *cur, const long long *v, PyObject *payload)
{
    PyObject *args[MAX_FIELDS + 1];
    int made = 0;
    long long cid = -3;
    for (; made < ENTER_ARGS; made++)
        if ((args[made] = PyLong_FromLongLong(v[made])) == NULL)
            goto out;
    if (cur->slow_enter == NULL || cur->slow_enter == Py_None) {
        cid = -2; /* as Cursor.enter: nowhere to write it */
        goto out;
    }
    args[ENTER_ARGS] = payload != NULL ? payload : Py_None;
    PyObject *r = PyObject_Vectorcall(cur->slow_enter, args, ENTER_ARGS + 1, NULL);
    if (r != NULL) {
        cid = as_ll(r);
        Py_DECREF(r);
        if (cid == -1 && PyErr_Occurred())
            cid = -3;
    }
out:
    for (int i = 0; i < made; i++)
        Py_DECREF(args[i]);
    return cid;
}

static int
slow_done(Cursor *cur, long long cid, long long end, long long issued, PyObject *payload)
{
    long long v[6] = {cid, end, issued, 0, -1, -1};
    PyObject *args[7];
    int made = 0, rc = -3;
    for (; made < 6; made++)
        if ((args[made] = PyLong_FromLongLong(v[made])) == NULL)
            goto out;
    if (cur->slow_done == NULL || cur->slow_done == Py_None) {
        rc = 0; /* as Cursor.done: nowhere to write it */
        goto out;
    }
    args[6] = payload != NULL ? payload : Py_None;
    PyObject *r = PyObject_Vectorcall(cur->slow_done, args, 7, NULL);
    if (r != NULL) {
        rc = 0;
        Py_DECREF(r);
    }
out:
    for (int i = 0; i < made; i++)
        Py_DECREF(args[i]);
    return rc;
}

/* The call failed in the backend (fn or wait raised): self.complete(call, exc), and the
 * exception goes on to the program. */
static PyObject *
failed_call(CallState *self, PyObject *call)
{
    PyObject *exc = take_error();
    if (exc == NULL)
        return NULL;
    PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, s_complete, call, exc, NULL);
    if (r == NULL) {
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(r);
    give_error(exc);
    return NULL;
}

/* What the blocking path uses, held for the length of the call: the backend releases the
 * GIL while it runs, and another thread may drop the call's or the state's references. */
typedef struct {
    PyObject *ins, *outs, *fn, *args, *cursor, *rec, *log_payload, *done_work;
} Held;

static void
held_release(Held *h)
{
    Py_XDECREF(h->ins);
    Py_XDECREF(h->outs);
    Py_XDECREF(h->fn);
    Py_XDECREF(h->args);
    Py_XDECREF(h->cursor);
    Py_XDECREF(h->rec);
    Py_XDECREF(h->log_payload);
    Py_XDECREF(h->done_work);
}

/* The recorder lets go of a completed call's tensors and backend (as CallRecorder.settle
 * does without a memory tracker). */
static void
let_go(PyObject *call)
{
    slot_set(call, C_INS, Py_NewRef(Py_None));
    slot_set(call, C_OUTS, Py_NewRef(Py_None));
    slot_set(call, C_FN, Py_NewRef(Py_None));
    slot_set(call, C_ARGS, Py_NewRef(Py_None));
}

/* After the call ran, its bookkeeping failed (the pending error): as the Python path does
 * with an error while it writes the DONE, the recording fails (rec.fail) and the program
 * gets what it would have; the call is let go (not open, its references dropped). */
static PyObject *
ran_but_failed(CallState *self, PyObject *call, PyObject *key, Held *h, PyObject *work, int p2p)
{
    if (fail(self) < 0) {
        Py_DECREF(work);
        return NULL;
    }
    slot_set(call, C_DONE, Py_NewRef(Py_True));
    if (PyDict_DelItem(self->open, key) < 0)
        PyErr_Clear();
    let_go(call);
    if (p2p) { /* a blocking send or recv's Work waited again would wait for another message */
        Py_DECREF(work);
        return PyObject_CallNoArgs(h->done_work);
    }
    return work;
}

/* The call's record once it ran: the call done, its DONE, its references let go. */
static PyObject *
completed(CallState *self, PyObject *call, Held *h, long long cid, long long issued, PyObject *issued_obj,
          PyObject *key, PyObject *work, int p2p, int receives)
{
    long long end = now_ns();
    slot_set(call, C_DONE, Py_NewRef(Py_True));
    if (PyDict_DelItem(self->open, key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return ran_but_failed(self, call, key, h, work, p2p);
        PyErr_Clear();
    }
    PyObject *last = self->last_return;
    int same = last == issued_obj;
    if (!same && last != NULL && PyLong_CheckExact(last)) {
        same = PyObject_RichCompareBool(last, issued_obj, Py_EQ);
        if (same < 0)
            return ran_but_failed(self, call, key, h, work, p2p);
    }
    if (same) { /* the caller was waiting until now: not compute */
        PyObject *e = PyLong_FromLongLong(end);
        if (e == NULL)
            return ran_but_failed(self, call, key, h, work, p2p);
        Py_XSETREF(self->last_return, e);
    }
    PyObject *on = PyObject_GetAttr(h->rec, s_on);
    int is_on = on == NULL ? -1 : PyObject_IsTrue(on);
    Py_XDECREF(on);
    if (is_on < 0)
        return ran_but_failed(self, call, key, h, work, p2p);
    if (is_on) {
        PyObject *out_payload = NULL;
        int rc = 0;
        if (self->mode && (!p2p || receives)) {
            out_payload = payload_of(self, h->log_payload, h->outs);
            if (out_payload == NULL)
                rc = -3;
        }
        if (rc == 0) {
            Cursor *cur = (Cursor *)h->cursor;
            rc = write_done(cur, cid, end, issued, 0, -1, -1, out_payload);
            if (rc == -1)
                rc = slow_done(cur, cid, end, issued, out_payload);
        }
        Py_XDECREF(out_payload);
        if (rc == -3 && fail(self) < 0) {
            Py_DECREF(work);
            return NULL;
        }
    }
    if (!is_none(self->tracker)) {
        PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, s_settle, call);
        if (r == NULL) {
            Py_DECREF(work);
            return NULL;
        }
        Py_DECREF(r);
    } else {
        let_go(call);
    }
    if (p2p) {
        Py_DECREF(work);
        return PyObject_CallNoArgs(h->done_work);
    }
    return work;
}

/* The ENTER is written: note the call open, run it, wait for it, complete it. */
static PyObject *
entered(CallState *self, PyObject *call, Held *h, long long cid, long long start, int p2p, int receives)
{
    PyObject *key = PyLong_FromVoidPtr(call), *cid_obj = PyLong_FromLongLong(cid);
    PyObject *start_obj = PyLong_FromLongLong(start), *zero = PyLong_FromLong(0);
    if (key == NULL || cid_obj == NULL || start_obj == NULL || zero == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(cid_obj);
        Py_XDECREF(start_obj);
        Py_XDECREF(zero);
        goto unrecorded;
    }
    Py_XSETREF(self->last_return, Py_NewRef(Py_None));
    slot_set(call, C_CID, cid_obj);
    slot_set(call, C_START, start_obj);
    slot_set(call, C_STEP, Py_NewRef(self->step));
    slot_set(call, C_ISSUED, zero);
    if (PyDict_SetItem(self->open, key, call) < 0) {
        Py_DECREF(key);
        goto unrecorded;
    }
    PyObject *work = PyObject_Call(h->fn, h->args, NULL);
    if (work == NULL) {
        Py_DECREF(key);
        return failed_call(self, call);
    }
    long long issued = now_ns();
    PyObject *issued_obj = PyLong_FromLongLong(issued);
    if (issued_obj == NULL) {
        PyObject *r = ran_but_failed(self, call, key, h, work, p2p);
        Py_DECREF(key);
        return r;
    }
    slot_set(call, C_ISSUED, Py_NewRef(issued_obj));
    Py_XSETREF(self->last_return, Py_NewRef(issued_obj));
    if (work != Py_None) {
        PyObject *r = PyObject_CallMethodNoArgs(work, s_wait);
        if (r == NULL) {
            Py_DECREF(key);
            Py_DECREF(issued_obj);
            Py_DECREF(work);
            return failed_call(self, call);
        }
        Py_DECREF(r);
    }
    PyObject *result = completed(self, call, h, cid, issued, issued_obj, key, work, p2p, receives);
    Py_DECREF(key);
    Py_DECREF(issued_obj);
    return result;

unrecorded: /* as the Python path's enter failing: the recording fails, the call runs */
    if (fail(self) < 0)
        return NULL;
    return PyObject_Call(h->fn, h->args, NULL);
}

/* CallRecorder.blocking (recorder/_calls.py), its common case: enter, run, wait and
 * complete a blocking call. Anything else: the Python path. */
static PyObject *
blocking_held(CallState *self, PyObject *call, Held *h, int p2p, int receives)
{
    Cursor *cur = (Cursor *)h->cursor;
    long long v[MAX_FIELDS];
    PyObject *payload = NULL, *frames = NULL;
    if (p2p) { /* _in_backward: a pass not seen yet is the Python path's to note */
        PyObject *task = Py_NewRef(self->graph_task);
        PyObject *tid = PyObject_CallNoArgs(task);
        Py_DECREF(task);
        if (tid == NULL)
            goto not_entered;
        long long t = as_ll(tid), seen = as_ll(self->task_seen);
        Py_DECREF(tid);
        if (PyErr_Occurred())
            goto not_entered;
        if (t != -1 && t != seen)
            goto python;
    }
    long long start = now_ns();
    long long in_desc = desc_id(self, h->ins), out_desc = 0, flags, peer;
    if (in_desc <= 0)
        goto not_entered;
    if (p2p) {
        flags = receives ? L.e_p2p | L.e_recv : L.e_p2p;
        PyObject *o = SLOT(call, C_PEER);
        peer = is_none(o) ? -1 : as_ll(o);
        if (PyErr_Occurred())
            goto not_entered;
    } else {
        PyObject *o = SLOT(call, C_ROOT);
        peer = is_none(o) ? -1 : as_ll(o);
        if (PyErr_Occurred())
            goto not_entered;
        if (h->outs == h->ins) {
            flags = L.e_same_out;
        } else {
            flags = 0;
            out_desc = desc_id(self, h->outs);
            if (out_desc <= 0)
                goto not_entered;
        }
    }
    long long stack_id = 0;
    if (self->stack_depth > 0) {
        PyObject *c = self->stack_caches;
        if (c == NULL || !PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 3 || !PyDict_Check(PyTuple_GET_ITEM(c, 0))
            || !PyDict_Check(PyTuple_GET_ITEM(c, 1)) || !PyDict_Check(PyTuple_GET_ITEM(c, 2)))
            goto python;
        /* two frames out: the group's _collective or _p2p, and its method */
        frames = stack_walk(self->stack_depth, 2, PyTuple_GET_ITEM(c, 0), PyTuple_GET_ITEM(c, 1),
                            PyTuple_GET_ITEM(c, 2));
        if (frames == NULL)
            goto not_entered;
        if (frames == Py_False)
            goto python;
        if (PyTuple_GET_SIZE(frames)) {
            PyObject *got = PyDict_GetItemWithError(self->stacks, frames);
            if (got == NULL)
                goto not_entered;
            stack_id = as_ll(got);
        }
        Py_CLEAR(frames);
    }
    long long op = name_id(self, SLOT(call, C_OP)), reduce_op = 0;
    if (op <= 0)
        goto not_entered;
    if (!is_none(SLOT(call, C_REDUCE_OP)) && (reduce_op = name_id(self, SLOT(call, C_REDUCE_OP))) <= 0)
        goto not_entered;
    if (self->mode && self->inputs && !receives && (payload = payload_of(self, h->log_payload, h->ins)) == NULL)
        goto not_entered;
    PyObject *prev = self->last_return;
    int prev_true = is_none(prev) ? 0 : PyObject_IsTrue(prev);
    /* enter's arguments, each where `bind` found its name */
    v[arg_at[A_FLAGS]] = flags;
    v[arg_at[A_START]] = start;
    v[arg_at[A_PREV]] = prev_true > 0 ? as_ll(prev) : 0;
    v[arg_at[A_STEP]] = as_ll(self->step);
    v[arg_at[A_GROUP]] = as_ll(SLOT(call, C_GID));
    v[arg_at[A_CALL_SEQ]] = as_ll(SLOT(call, C_SEQ));
    v[arg_at[A_PEER]] = peer;
    v[arg_at[A_TAG]] = as_ll(SLOT(call, C_TAG));
    v[arg_at[A_IN_DESC]] = in_desc;
    v[arg_at[A_OUT_DESC]] = out_desc;
    v[arg_at[A_STACK]] = stack_id;
    v[arg_at[A_OP]] = op;
    v[arg_at[A_REDUCE_OP]] = reduce_op;
    v[arg_at[A_MEM_ALLOC]] = v[arg_at[A_MEM_PEAK]] = -1;
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            goto not_entered;
        PyErr_Clear(); /* an int no field holds: the Python path's, which struct refuses */
        goto python;
    }
    long long cid = write_enter(cur, v, payload);
    if (cid == -1)
        cid = slow_enter(cur, v, payload);
    Py_CLEAR(payload);
    if (cid == -3)
        goto not_entered;
    return entered(self, call, h, cid, start, p2p, receives);

python: /* a miss of a cache the Python path fills: it runs the call, from the start */
    Py_XDECREF(frames);
    Py_XDECREF(payload);
    return fallback(self, call);

not_entered: /* an error (or a miss: the Python path's) before the ENTER */
    Py_XDECREF(frames);
    Py_XDECREF(payload);
    if (!PyErr_Occurred())
        return fallback(self, call);
    /* the Python path would fail the recording (rec.fail) and run the call unrecorded */
    if (fail(self) < 0)
        return NULL;
    return PyObject_Call(h->fn, h->args, NULL);
}

static PyObject *
CallState_fast_blocking(CallState *self, PyObject *call)
{
    if (call_type == NULL || Py_TYPE(call) != call_type || is_none(self->cursor)
        || !Py_IS_TYPE(self->cursor, &CursorType) || !is_none(self->later) || !is_none(self->memory)
        || !is_none(self->tracker) || !is_none(self->ops_mode) || !is_none(self->device) || self->mode == full_mode
        || self->open == NULL || !PyDict_CheckExact(self->open) || PyDict_GET_SIZE(self->open)
        || self->finished == NULL || !PyDict_Check(self->finished) || PyDict_GET_SIZE(self->finished)
        || self->descs == NULL || !PyDict_Check(self->descs) || self->names == NULL || !PyDict_Check(self->names)
        || self->stacks == NULL || !PyDict_Check(self->stacks) || self->rec == NULL
        || self->log_payload == NULL || self->step == NULL || !PyLong_Check(self->step))
        return fallback(self, call);
    for (int i = 0; i < C_CID; i++)
        if (SLOT(call, i) == NULL)
            return fallback(self, call);
    PyObject *ins = SLOT(call, C_INS), *outs = SLOT(call, C_OUTS), *fargs = SLOT(call, C_ARGS);
    int p2p = SLOT(call, C_P2P) == Py_True, receives = SLOT(call, C_RECEIVES) == Py_True;
    if (SLOT(call, C_ASYNC) != Py_False || !(PyList_CheckExact(ins) || PyTuple_CheckExact(ins))
        || !(PyList_CheckExact(outs) || PyTuple_CheckExact(outs)) || !PyTuple_CheckExact(fargs))
        return fallback(self, call);
    if (p2p && (is_none(self->graph_task) || self->task_seen == NULL || self->done_work == NULL))
        return fallback(self, call);
    Held h = {Py_NewRef(ins), Py_NewRef(outs), Py_NewRef(SLOT(call, C_FN)), Py_NewRef(fargs),
              Py_NewRef(self->cursor), Py_NewRef(self->rec), Py_NewRef(self->log_payload),
              Py_XNewRef(self->done_work)};
    PyObject *result = blocking_held(self, call, &h, p2p, receives);
    held_release(&h);
    return result;
}

/* The name of a reduce op (as intercept/group.op_names()'s function names it): a new reference, NULL on an error. */
static PyObject *
reduce_op_name(CallState *self, PyObject *op)
{
    if (op == Py_None)
        return Py_NewRef(Py_None);
    if (self->op_names != NULL && PyDict_Check(self->op_names) && self->reduce_op_type != NULL
        && (PyObject *)Py_TYPE(op) == self->reduce_op_type) {
        Py_hash_t h = PyObject_Hash(op);
        if (h == -1)
            return NULL;
        PyObject *key = PyLong_FromSsize_t(h);
        if (key == NULL)
            return NULL;
        PyObject *name = PyDict_GetItemWithError(self->op_names, key);
        Py_DECREF(key);
        if (name != NULL)
            return Py_NewRef(name);
        if (PyErr_Occurred())
            return NULL;
    }
    if (self->op_name == NULL)
        return PyErr_Format(PyExc_TypeError, "no _op_name (intercept/group.op_names())"), NULL;
    return PyObject_CallOneArg(self->op_name, op);
}

/* fast_collective(op, gid, seq, ins, outs, fn, args, reduce_op, root): the group's blocking
 * collective as one Call (intercept/group.py's: bind's prototype, then what it is given, the
 * reduce op named as op_names() names it), through fast_blocking. */
static PyObject *
CallState_fast_collective(CallState *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "fast_collective(op, gid, seq, ins, outs, fn, args, reduce_op, root)");
        return NULL;
    }
    if (call_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fast_collective: bind(Call, ...) was not called");
        return NULL;
    }
    PyObject *name = reduce_op_name(self, args[7]);
    if (name == NULL)
        return NULL;
    PyObject *call = call_type->tp_alloc(call_type, 0);
    if (call == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    /* Call(...) as its __init__ leaves it (the prototype's slots), then what it was given */
    for (int i = 0; i < proto_n; i++) { /* (the slots given below are not among them) */
        PyObject *v = *(PyObject **)((char *)call_proto + proto_offsets[i]);
        *(PyObject **)((char *)call + proto_offsets[i]) = Py_XNewRef(v);
    }
    SLOT(call, C_OP) = Py_NewRef(args[0]); /* NULL until now: tp_alloc zeroes */
    SLOT(call, C_GID) = Py_NewRef(args[1]);
    SLOT(call, C_SEQ) = Py_NewRef(args[2]);
    SLOT(call, C_INS) = Py_NewRef(args[3]);
    SLOT(call, C_OUTS) = Py_NewRef(args[4]);
    SLOT(call, C_FN) = Py_NewRef(args[5]);
    SLOT(call, C_ARGS) = Py_NewRef(args[6]);
    SLOT(call, C_REDUCE_OP) = name;
    SLOT(call, C_ROOT) = Py_NewRef(args[8]);
    PyObject *result = CallState_fast_blocking(self, call);
    Py_DECREF(call);
    return result;
}

static PyMethodDef CallState_methods[] = {
    {"fast_blocking", (PyCFunction)CallState_fast_blocking, METH_O,
     "CallRecorder.blocking's common case in C; anything else through self._blocking_py(call)."},
    {"fast_collective", (PyCFunction)(void (*)(void))CallState_fast_collective, METH_FASTCALL,
     "fast_collective(op, gid, seq, ins, outs, fn, args, reduce_op, root): a blocking collective's Call, made "
     "here, through fast_blocking."},
    {NULL}
};

#define OBJ_MEMBER(name, field, doc) {name, T_OBJECT, offsetof(CallState, field), 0, doc}
static PyMemberDef CallState_members[] = {
    OBJ_MEMBER("rec", rec, "the Recording"),
    OBJ_MEMBER("open", open, "id(call) -> call: entered, not completed"),
    OBJ_MEMBER("finished", finished, "calls whose outputs the program's thread has yet to write"),
    OBJ_MEMBER("later", later, "a DevicePayloads, or None"),
    OBJ_MEMBER("memory", memory, "() -> (allocated, peak), or None"),
    OBJ_MEMBER("tracker", tracker, "the CPU memory tracker, or None"),
    OBJ_MEMBER("ops_mode", ops_mode, "the per-operator dispatch mode, or None"),
    OBJ_MEMBER("device", device, "the recording's DeviceTimes, or None"),
    OBJ_MEMBER("last_return", last_return, "when the previous call gave control back, or None"),
    OBJ_MEMBER("step", step, "the step"),
    OBJ_MEMBER("_descs", descs, "(shape, dtype) or a tuple of them -> dictionary id"),
    OBJ_MEMBER("_names", names, "name -> dictionary id"),
    OBJ_MEMBER("_stacks", stacks, "stack -> dictionary id"),
    OBJ_MEMBER("_graph_task", graph_task, "torch's current autograd graph task id, once looked up"),
    OBJ_MEMBER("_task_seen", task_seen, "the last backward pass that got an end-of-backward reap"),
    OBJ_MEMBER("_cursor", cursor, "the call log's Cursor, or None"),
    OBJ_MEMBER("_stack_caches", stack_caches, "intercept/stack.py's (is_user, texts, stacks), or None"),
    OBJ_MEMBER("_log_payload", log_payload, "intercept/payload.log_payload"),
    OBJ_MEMBER("_done_work", done_work, "() -> a completed Work"),
    OBJ_MEMBER("_op_names", op_names, "intercept/group.op_names()'s: hash(a ReduceOp) -> its name"),
    OBJ_MEMBER("_op_name", op_name, "intercept/group.op_names()'s: a reduce op's name"),
    OBJ_MEMBER("_reduce_op_type", reduce_op_type, "torch's ReduceOp"),
    OBJ_MEMBER("_tensor_type", tensor_type, "torch.Tensor (small_payload: log_payload's small plain tensors in C), or None"),
    OBJ_MEMBER("_strided", strided, "torch.strided"),
    {"_keep_small", T_LONGLONG, offsetof(CallState, keep_small), 0, "payload.KEEP_SMALL"},
    {"_small_what", T_INT, offsetof(CallState, small_what), 0, "the payload flags of a small tensor's bytes"},
    {"mode", T_INT, offsetof(CallState, mode), 0, "the payload mode (intercept/payload.MODES)"},
    {"inputs", T_BOOL, offsetof(CallState, inputs), 0, "whether inputs' payloads are kept"},
    {"stack_depth", T_INT, offsetof(CallState, stack_depth), 0, "frames of user code kept per call"},
    {"inline_max", T_LONGLONG, offsetof(CallState, inline_max), 0, "payloads kept in the log up to this size"},
    {NULL}
};

static PyTypeObject CallStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prism_rr._speedups.CallState",
    .tp_basicsize = sizeof(CallState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The hot state of recorder/_calls.py's CallRecorder, and its blocking call path in C.",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)CallState_traverse,
    .tp_clear = (inquiry)CallState_clear,
    .tp_dealloc = (destructor)CallState_dealloc,
    .tp_methods = CallState_methods,
    .tp_members = CallState_members,
};

static PyMethodDef module_methods[] = {
    {"stack", (PyCFunction)(void (*)(void))stack, METH_FASTCALL, "caller_stack from its caches, or False."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(Call, prototype, enter_args, full): what CallState's blocking path makes and writes."},
    {"entry_layout", (PyCFunction)(void (*)(void))entry_layout, METH_FASTCALL,
     "entry_layout([namespace]): the call log's layout as written here, read from format/calllog.py (or namespace)."},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "prism_rr._speedups", "The recorder's per-call path in C (optional).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&CursorType) < 0 || PyType_Ready(&CallStateType) < 0)
        return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_wait, "wait") INTERN(s_complete, "complete") INTERN(s_fail, "fail") INTERN(s_on, "on")
    INTERN(s_settle, "settle") INTERN(s_blocking_py, "_blocking_py") INTERN(s_shape, "shape") INTERN(s_dtype, "dtype")
    INTERN(s_layout, "layout") INTERN(s_is_cpu, "is_cpu") INTERN(s_is_contiguous, "is_contiguous")
    INTERN(s_nbytes, "nbytes") INTERN(s_data_ptr, "data_ptr")
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CursorType);
    if (PyModule_AddObject(m, "Cursor", (PyObject *)&CursorType) < 0) {
        Py_DECREF(&CursorType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CallStateType);
    if (PyModule_AddObject(m, "CallState", (PyObject *)&CallStateType) < 0) {
        Py_DECREF(&CallStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
