/* prism_rr._speedups: the recorder's per-call path in C, where a compiler was present.
 *
 * Optional: pip builds it on install when it can (setup.py, `optional=True`), and every
 * function here has a pure-Python twin that writes the same bytes (format/calllog.py's
 * Cursor, intercept/stack.py's caller_stack); PRISM_RR_PURE_PYTHON=1 makes prism-rr use
 * the twins. Nothing here imports torch or reads a tensor: a tensor's bytes come as a
 * pointer and a length that the caller read from torch.
 *
 * Cursor: the writing position of a call log's ring and its two hot entries, ENTER and
 * DONE (layouts: FORMAT.md, "Call log"; format/calllog.py). Each method runs whole with
 * the GIL held, so no other Python thread writes in between. When the entry needs the
 * slow path (padding to the ring's end, room made by dropping old entries, a compactor
 * reading: `busy`), the method writes nothing and calls `slow_enter` or `slow_done` with
 * its own arguments (the Python path, which takes the log's lock), or returns -2.
 *
 * stack: caller_stack's walk over the caller's frames, from its caches only (and caches of
 * its own in front of them); False on any miss (the Python walk fills the caches). On
 * Python 3.11 it reads the interpreter's frames, making no frame objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

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

#define SEQ_KEY 0x5052524C4F470000ULL
#define ALIGN 16
#define T_ENTER 1
#define T_DONE 2
#define ENTER_SIZE 96
#define ENTER_BODY 88
#define DONE_SIZE 64
#define DONE_BODY 48
#define AUX_PAYLOAD 1
#define ONE_BYTES 12

#if PY_BIG_ENDIAN
#error "prism_rr._speedups writes little-endian entries: build without it (the pure-Python path)"
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
    PyObject *slow_enter; /* what enter and done call instead when they cannot write here */
    PyObject *slow_done;
} Cursor;

static inline void put_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_i32(char *p, int32_t v) { memcpy(p, &v, 4); }
static inline void put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }
static inline void put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }

static int
Cursor_init(Cursor *self, PyObject *args, PyObject *kwds)
{
    PyObject *buffer, *open;
    long long ring_at, ring_size;
    if (!PyArg_ParseTuple(args, "OLLO", &buffer, &ring_at, &ring_size, &open))
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

/* The payload part an entry carries: a bytes-like object, or one tensor's bytes from
 * memory (ptr, nbytes, what). Its length, or -1 with no payload. */
typedef struct {
    Py_buffer buf;
    int has_buf;
    const char *ptr;
    long long nbytes;
    int what;
} Payload;

static int
payload_parse(PyObject *payload, Payload *p, long long *len)
{
    p->has_buf = 0;
    p->ptr = NULL;
    *len = -1;
    if (payload == NULL || payload == Py_None)
        return 0;
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
        *len = ONE_BYTES + p->nbytes;
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
    put_u16(dst, 1);
    dst[2] = (char)p->what;
    dst[3] = 0;
    put_u32(dst + 4, (uint32_t)p->nbytes);
    put_u32(dst + 8, (uint32_t)p->nbytes);
    if (p->nbytes)
        memcpy(dst + ONE_BYTES, p->ptr, (size_t)p->nbytes);
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
    put_u64(e + n - 8, seq ^ SEQ_KEY);
}

static int
set_open(Cursor *self, long long cid, long long pos)
{
    if (self->open == NULL)
        return 0;
    PyObject *k = PyLong_FromLongLong(cid), *v = PyLong_FromLongLong(pos);
    int rc = (k && v) ? PyDict_SetItem(self->open, k, v) : -1;
    Py_XDECREF(k);
    Py_XDECREF(v);
    return rc;
}

static int
pop_open(Cursor *self, long long cid)
{
    if (self->open == NULL)
        return 0;
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

/* enter(flags, start, prev, step, group, call_seq, peer, tag, in_desc, out_desc, stack, op,
 *       reduce_op, mem_alloc, mem_peak[, payload]) -> call id. payload: None, bytes, or
 *       (address, nbytes, what): one tensor's bytes to copy from memory. */
static PyObject *
Cursor_enter(Cursor *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 15 && nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "enter takes 15 or 16 arguments");
        return NULL;
    }
    ARG_LL(0, flags); ARG_LL(1, start); ARG_LL(2, prev); ARG_LL(3, step); ARG_LL(4, group);
    ARG_LL(5, call_seq); ARG_LL(6, peer); ARG_LL(7, tag); ARG_LL(8, in_desc); ARG_LL(9, out_desc);
    ARG_LL(10, stack); ARG_LL(11, op); ARG_LL(12, reduce_op); ARG_LL(13, alloc); ARG_LL(14, peak);
    if (PyErr_Occurred())
        return NULL;
    Payload p;
    long long plen;
    if (payload_parse(nargs > 15 ? args[15] : NULL, &p, &plen) < 0)
        return NULL;
    long long n = plen < 0 ? ENTER_SIZE : ((ENTER_BODY + plen + 8 + ALIGN - 1) & ~(long long)(ALIGN - 1));
    long long at = room(self, n);
    if (at < 0) {
        payload_done(&p);
        if (self->slow_enter == NULL || self->slow_enter == Py_None)
            return PyLong_FromLong(-2);
        return PyObject_Vectorcall(self->slow_enter, args, nargs, NULL);
    }
    long long pos = self->head, seq = self->seq + 1;
    char *e = self->ring + at;
    put_u32(e, (uint32_t)n);
    e[4] = T_ENTER;
    e[5] = (char)flags;
    put_u16(e + 6, plen < 0 ? 0 : AUX_PAYLOAD);
    put_i64(e + 8, start);
    put_i64(e + 16, prev);
    put_u64(e + 24, (uint64_t)seq);
    put_i32(e + 32, (int32_t)step);
    put_i32(e + 36, (int32_t)group);
    put_i64(e + 40, call_seq);
    put_i32(e + 48, (int32_t)peer);
    put_i32(e + 52, (int32_t)tag);
    put_u32(e + 56, (uint32_t)in_desc);
    put_u32(e + 60, (uint32_t)out_desc);
    put_u32(e + 64, (uint32_t)stack);
    put_u16(e + 68, (uint16_t)op);
    put_u16(e + 70, (uint16_t)reduce_op);
    put_i64(e + 72, alloc);
    put_i64(e + 80, peak);
    long long used = ENTER_BODY;
    if (plen >= 0) {
        payload_write(e + ENTER_BODY, &p);
        used += plen;
    }
    payload_done(&p);
    commit(e, n, used, (uint64_t)seq);
    self->seq = seq;
    self->head = pos + n;
    if (set_open(self, seq, pos) < 0)
        return NULL;
    return PyLong_FromLongLong(seq);
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
    if (PyErr_Occurred())
        return NULL;
    Payload p;
    long long plen;
    if (payload_parse(nargs > 6 ? args[6] : NULL, &p, &plen) < 0)
        return NULL;
    long long n = plen < 0 ? DONE_SIZE : ((DONE_BODY + plen + 8 + ALIGN - 1) & ~(long long)(ALIGN - 1));
    long long at = cid < 0 ? -1 : room(self, n); /* a call whose ENTER was dropped: the slow path counts it */
    if (at < 0) {
        payload_done(&p);
        if (self->slow_done == NULL || self->slow_done == Py_None)
            return PyLong_FromLong(-2);
        return PyObject_Vectorcall(self->slow_done, args, nargs, NULL);
    }
    long long seq = self->seq + 1;
    char *e = self->ring + at;
    put_u32(e, (uint32_t)n);
    e[4] = T_DONE;
    e[5] = (char)flags;
    put_u16(e + 6, plen < 0 ? 0 : AUX_PAYLOAD);
    put_u64(e + 8, (uint64_t)cid);
    put_i64(e + 16, end);
    put_i64(e + 24, issued);
    put_i32(e + 32, (int32_t)peer);
    put_i32(e + 36, 0);
    put_i64(e + 40, call_seq);
    long long used = DONE_BODY;
    if (plen >= 0) {
        payload_write(e + DONE_BODY, &p);
        used += plen;
    }
    payload_done(&p);
    commit(e, n, used, (uint64_t)seq);
    self->seq = seq;
    self->head += n;
    if (pop_open(self, cid) < 0)
        return NULL;
    return PyLong_FromLong(0);
}

static PyObject *
Cursor_state(Cursor *self, PyObject *unused)
{
    return Py_BuildValue("(LLLL)", self->head, self->tail, self->tail_seq, self->seq);
}

static PyMethodDef Cursor_methods[] = {
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

/* stack(depth, skip, is_user, texts, stacks): caller_stack from its caches. skip: frames
 * above the caller of this function. A tuple of texts (interned in `stacks`), () when no
 * frame is user code, False on a cache miss. */
static PyObject *
stack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
#if PY_VERSION_HEX < 0x030B0000
    Py_RETURN_FALSE;
#else
    if (nargs != 5 || !PyDict_Check(args[2]) || !PyDict_Check(args[3]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "stack(depth, skip, is_user, texts, stacks)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[0]), skip = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (depth > 64)
        depth = 64;
    PyObject *is_user = args[2], *texts = args[3], *stacks = args[4];
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

static PyMethodDef module_methods[] = {
    {"stack", (PyCFunction)(void (*)(void))stack, METH_FASTCALL, "caller_stack from its caches, or False."},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "prism_rr._speedups", "The recorder's per-call path in C (optional).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&CursorType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CursorType);
    if (PyModule_AddObject(m, "Cursor", (PyObject *)&CursorType) < 0) {
        Py_DECREF(&CursorType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
