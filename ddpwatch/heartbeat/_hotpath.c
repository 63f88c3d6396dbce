/* The heartbeat hot path in C: what runs at every collective of a watched rank.
 *
 * Why C: a collective's entry and exit heartbeats plus the Python wrapper around
 * the collective cost about 1.8 us of CPU per call in CPython. On a small host a
 * loopback all-reduce of one element takes 60-100 us and CPU spent around it is
 * amplified by the ranks' threads competing for cores, so the Python path made a
 * loop of such calls 4-7% slower. Here the same work is a few stores and one
 * clock read.
 *
 * Two types, both mirrors of pure-Python code that stays the fallback and the
 * reference (ddpwatch/heartbeat/pycore.py `PyCore`, ddpwatch/rank/instrumentation.py
 * `_wrap`); tests run the same checks against both:
 *   Core     one rank's record: the seqlock, the progress state, the ring.
 *   Wrapper  a torch.distributed function wrapped with entry/exit heartbeats.
 *
 * Thread safety comes from the GIL: no method here releases it or calls back
 * into Python while the record is half written, so each method is atomic with
 * respect to other Python threads (async completion callbacks). The module does
 * not declare free-threading support, so a free-threaded CPython keeps the GIL on.
 *
 * Memory order: the seqlock writes seq odd, then the fields, then seq even. The
 * release fence after the odd store and the release store of the even value keep
 * that order on any CPU, not only on x86's total store order. The daemon's side,
 * read_once, pairs them with acquire ordering.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* Must equal ddpwatch/heartbeat/layout.py; the Python side checks LAYOUT_VERSION
 * and FIELDS before it uses this module. */
#define LAYOUT_VERSION 2
enum {
    F_COLLECTIVE_SEQ, F_OP, F_BYTES, F_ENTERED_AT, F_PHASE, F_OUTSTANDING, F_UPDATED_AT,
    F_COLLECTIVES_COMPLETED, F_COLLECTIVE_SECONDS, F_BYTES_TOTAL, F_STEP, F_STEP_STARTED_AT,
    F_STEPS_COMPLETED, F_STEP_SECONDS, F_LAST_STEP_SECONDS, F_TOKENS, F_LAST_STEP_TOKENS,
    N_FIELDS
};
static const char *FIELD_NAMES[N_FIELDS] = {
    "collective_seq", "op", "bytes", "entered_at", "phase", "outstanding", "updated_at",
    "collectives_completed", "collective_seconds", "bytes_total", "step", "step_started_at",
    "steps_completed", "step_seconds", "last_step_seconds", "tokens", "last_step_tokens",
};
static const char FIELD_KINDS[N_FIELDS + 1] = "qqqdqqdqdqqdqddqq";
#define ENTRY_END 7   /* an entry rewrites fields [0, 7) */
#define EXIT_START 4  /* an exit rewrites fields [4, 10) */
#define EXIT_END 10
enum { PHASE_INIT = 0, PHASE_OUTSIDE = 1, PHASE_INSIDE = 2, PHASE_EXITED = 3 };
#define RING_SLOT_SIZE 40  /* seq, op, bytes (int64), start, end (double) */

typedef union { int64_t i; double d; } Cell;

typedef struct { int64_t seq; double start; int64_t op; int64_t nbytes; } Token;

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of Python's time.monotonic() */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ Core */
typedef struct {
    PyObject_HEAD
    Py_buffer view;        /* on the writable mmap of the record */
    int has_view;
    int closed;
    char *base;
    uint64_t *seqp;
    char *progress;
    char *ring;
    Py_ssize_t header_room; /* bytes before seq: the identity header */
    int64_t ring_slots;
    uint64_t seq;           /* the seqlock value last stored */
    Cell st[N_FIELDS];
    double busy_since;
} Core;

static inline void seq_begin(Core *c) {
    c->seq++;
    __atomic_store_n(c->seqp, c->seq, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void seq_end(Core *c) {
    c->seq++;
    __atomic_store_n(c->seqp, c->seq, __ATOMIC_RELEASE);
}

static inline void store_fields(Core *c, int from, int to) {
    memcpy(c->progress + 8 * from, &c->st[from], 8 * (size_t)(to - from));
}

static void publish_all(Core *c) {
    if (c->closed) return;
    seq_begin(c);
    store_fields(c, 0, N_FIELDS);
    seq_end(c);
}

static void core_enter(Core *c, int64_t op, int64_t nbytes, Token *tok) {
    Cell *st = c->st;
    double now = monotonic();
    int64_t seq = st[F_COLLECTIVE_SEQ].i + 1;
    int64_t outstanding = st[F_OUTSTANDING].i + 1;
    if (outstanding == 1) c->busy_since = now;
    st[F_COLLECTIVE_SEQ].i = seq;
    st[F_OP].i = op;
    st[F_BYTES].i = nbytes;
    st[F_ENTERED_AT].d = now;
    st[F_PHASE].i = PHASE_INSIDE;
    st[F_OUTSTANDING].i = outstanding;
    st[F_UPDATED_AT].d = now;
    if (!c->closed) {
        seq_begin(c);
        store_fields(c, 0, ENTRY_END);
        seq_end(c);
    }
    tok->seq = seq;
    tok->start = now;
    tok->op = op;
    tok->nbytes = nbytes;
}

static void core_exit(Core *c, const Token *tok) {
    Cell *st = c->st;
    double now = monotonic();
    int64_t outstanding = st[F_OUTSTANDING].i - 1;
    if (outstanding <= 0) {
        outstanding = 0;
        st[F_COLLECTIVE_SECONDS].d += now - c->busy_since;
    }
    st[F_PHASE].i = outstanding == 0 ? PHASE_OUTSIDE : PHASE_INSIDE;
    st[F_OUTSTANDING].i = outstanding;
    st[F_UPDATED_AT].d = now;
    st[F_COLLECTIVES_COMPLETED].i += 1;
    st[F_BYTES_TOTAL].i += tok->nbytes;
    if (!c->closed) {
        int64_t slot = tok->seq - 1;
        slot = ((slot % c->ring_slots) + c->ring_slots) % c->ring_slots;
        Cell ring[5];
        ring[0].i = tok->seq;
        ring[1].i = tok->op;
        ring[2].i = tok->nbytes;
        ring[3].d = tok->start;
        ring[4].d = now;
        seq_begin(c);
        memcpy(c->ring + slot * RING_SLOT_SIZE, ring, sizeof ring);
        store_fields(c, EXIT_START, EXIT_END);
        seq_end(c);
    }
}

static void core_release(Core *self);

static int Core_init(Core *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mem", "seq_offset", "progress_offset", "ring_offset",
                             "ring_slots", "header", NULL};
    PyObject *mem;
    Py_ssize_t seq_off, prog_off, ring_off, slots;
    Py_buffer header;
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "Core is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnnny*", kwlist, &mem, &seq_off, &prog_off,
                                     &ring_off, &slots, &header))
        return -1;
    if (PyObject_GetBuffer(mem, &self->view, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&header);
        return -1;
    }
    self->has_view = 1;
    Py_ssize_t len = self->view.len;
    const char *why = NULL;
    if (seq_off < 0 || seq_off % 8 || prog_off != seq_off + 8 || header.len > seq_off)
        why = "seq must be 8-aligned, right after the header, with progress right after it";
    else if (ring_off < prog_off + 8 * N_FIELDS || slots <= 0 || ring_off > len
             || slots > (len - ring_off) / RING_SLOT_SIZE)
        why = "record offsets do not fit the mapping";
    else if (((uintptr_t)((char *)self->view.buf + seq_off)) % 8)
        why = "seq is not 8-byte aligned in the mapping";
    if (why) {
        PyBuffer_Release(&header);
        core_release(self);  /* closed, and the mapping free to close */
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    self->base = (char *)self->view.buf;
    self->seqp = (uint64_t *)(self->base + seq_off);
    self->progress = self->base + prog_off;
    self->ring = self->base + ring_off;
    self->header_room = seq_off;
    self->ring_slots = slots;
    self->seq = __atomic_load_n(self->seqp, __ATOMIC_RELAXED) & ~(uint64_t)1;
    memset(self->st, 0, sizeof self->st);
    self->st[F_PHASE].i = PHASE_INIT;
    double now = monotonic();
    self->st[F_STEP_STARTED_AT].d = now;  /* the first step is timed from here */
    self->st[F_UPDATED_AT].d = now;
    self->closed = 0;  /* the only place a Core starts writing */
    seq_begin(self);
    memcpy(self->base, header.buf, (size_t)header.len);
    seq_end(self);
    PyBuffer_Release(&header);
    publish_all(self);
    return 0;
}

/* A Core writes nothing until __init__ succeeded (closed from birth). */
static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self) self->closed = 1;
    return (PyObject *)self;
}

static void core_release(Core *self) {
    self->closed = 1;
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
}

static void Core_dealloc(Core *self) {
    core_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *token_tuple(const Token *t) {
    return Py_BuildValue("(LdLL)", (long long)t->seq, t->start, (long long)t->op,
                         (long long)t->nbytes);
}

static int token_from(PyObject *obj, Token *t) {
    long long seq, op, nbytes;
    double start;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 4) {
        PyErr_SetString(PyExc_TypeError, "token must be the tuple enter() returned");
        return -1;
    }
    seq = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 0));
    start = PyFloat_AsDouble(PyTuple_GET_ITEM(obj, 1));
    op = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 2));
    nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 3));
    if (PyErr_Occurred()) return -1;
    t->seq = seq; t->start = start; t->op = op; t->nbytes = nbytes;
    return 0;
}

static PyObject *Core_enter(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "enter(op_code, nbytes)");
        return NULL;
    }
    long long op = PyLong_AsLongLong(args[0]);
    long long nbytes = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    Token t;
    core_enter(self, op, nbytes, &t);
    return token_tuple(&t);
}

static PyObject *Core_exit(Core *self, PyObject *token) {
    Token t;
    if (token == Py_None) Py_RETURN_NONE;  /* as NullWriter hands out */
    if (token_from(token, &t) < 0) return NULL;
    core_exit(self, &t);
    Py_RETURN_NONE;
}

static PyObject *Core_step(Core *self, PyObject *arg) {
    long long tokens = PyLong_AsLongLong(arg);
    if (tokens == -1 && PyErr_Occurred()) return NULL;
    Cell *st = self->st;
    double now = monotonic();
    st[F_LAST_STEP_SECONDS].d = now - st[F_STEP_STARTED_AT].d;
    st[F_STEP_SECONDS].d += st[F_LAST_STEP_SECONDS].d;
    st[F_STEPS_COMPLETED].i += 1;
    st[F_STEP].i += 1;
    st[F_TOKENS].i += tokens;
    st[F_LAST_STEP_TOKENS].i = tokens;
    st[F_STEP_STARTED_AT].d = st[F_UPDATED_AT].d = now;
    publish_all(self);
    Py_RETURN_NONE;
}

static PyObject *Core_set_phase(Core *self, PyObject *arg) {
    long phase = PyLong_AsLong(arg);
    if (phase == -1 && PyErr_Occurred()) return NULL;
    Cell *st = self->st;
    double now = monotonic();
    if (!st[F_OUTSTANDING].i) st[F_PHASE].i = phase;
    if (phase == PHASE_OUTSIDE && !st[F_STEPS_COMPLETED].i)
        st[F_STEP_STARTED_AT].d = now;  /* training starts after rendezvous */
    st[F_UPDATED_AT].d = now;
    publish_all(self);
    Py_RETURN_NONE;
}

static PyObject *Core_counters(Core *self, PyObject *unused) {
    double busy = self->st[F_COLLECTIVE_SECONDS].d;
    if (self->st[F_OUTSTANDING].i) busy += monotonic() - self->busy_since;
    return Py_BuildValue("(dL)", busy, (long long)self->st[F_COLLECTIVES_COMPLETED].i);
}

static PyObject *Core_write_header(Core *self, PyObject *arg) {
    Py_buffer header;
    if (PyObject_GetBuffer(arg, &header, PyBUF_SIMPLE) < 0) return NULL;
    if (header.len > self->header_room) {
        PyBuffer_Release(&header);
        PyErr_SetString(PyExc_ValueError, "header larger than the record's header room");
        return NULL;
    }
    if (!self->closed) {
        seq_begin(self);
        memcpy(self->base, header.buf, (size_t)header.len);
        seq_end(self);
    }
    PyBuffer_Release(&header);
    Py_RETURN_NONE;
}

static PyObject *Core_close(Core *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"exited", NULL};
    int exited = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p", kwlist, &exited)) return NULL;
    if (self->closed) Py_RETURN_NONE;
    if (exited) {
        self->st[F_PHASE].i = PHASE_EXITED;
        self->st[F_UPDATED_AT].d = monotonic();
        publish_all(self);
    }
    core_release(self);  /* the mapping may be closed after this */
    Py_RETURN_NONE;
}

static PyObject *Core_state(Core *self, PyObject *unused) {
    PyObject *t = PyTuple_New(N_FIELDS);
    if (!t) return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *v = FIELD_KINDS[i] == 'd' ? PyFloat_FromDouble(self->st[i].d)
                                            : PyLong_FromLongLong(self->st[i].i);
        if (!v) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *Core_get_closed(Core *self, void *unused) {
    return PyBool_FromLong(self->closed);
}

static PyMethodDef Core_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))Core_enter, METH_FASTCALL,
     "enter(op_code, nbytes) -> token: a collective begins"},
    {"exit", (PyCFunction)Core_exit, METH_O, "exit(token): the collective of token completed"},
    {"step", (PyCFunction)Core_step, METH_O, "step(tokens): a training step ended"},
    {"set_phase", (PyCFunction)Core_set_phase, METH_O, "set_phase(phase)"},
    {"counters", (PyCFunction)Core_counters, METH_NOARGS,
     "(seconds with a collective outstanding, collectives completed)"},
    {"write_header", (PyCFunction)Core_write_header, METH_O,
     "write_header(bytes): rewrite the identity header under the seqlock"},
    {"close", (PyCFunction)(void (*)(void))Core_close, METH_VARARGS | METH_KEYWORDS,
     "close(*, exited=True): publish EXITED (if asked) and let go of the mapping"},
    {"state", (PyCFunction)Core_state, METH_NOARGS, "the progress fields, in layout order"},
    {NULL}
};

static PyGetSetDef Core_getset[] = {
    {"closed", (getter)Core_get_closed, NULL, "no more writes to the record", NULL},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ddpwatch._hotpath.Core",
    .tp_doc = "One rank's heartbeat record, written in place (see heartbeat/pycore.py).",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Core_new,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};

/* --------------------------------------------------------------- Wrapper */
/* A collective currently running on this thread: a collective that calls
 * another (all_gather_object -> all_gather) counts once, as the outer. */
static _Thread_local int depth;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;           /* for functools.wraps: __name__, __doc__, __wrapped__ */
    PyObject *original;
    Core *core;
    int64_t op;
    PyObject *tensor_type;
    PyObject *payload_bytes;  /* payload_bytes(args, kwargs): the general case */
    PyObject *on_completion;  /* on_completion(result, token): async work */
} Wrapper;

static PyObject *nbytes_name;

/* Never raise into training, but never swallow a KeyboardInterrupt or SystemExit
 * either: only ordinary exceptions are cleared. Returns 0 if the error was kept. */
static int clear_ordinary_error(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return 0;
    PyErr_Clear();
    return 1;
}

/* The payload's bytes, or -1 with an exception that must propagate. */
static int64_t payload_bytes(Wrapper *w, PyObject *const *args, size_t nargs, PyObject *kwnames) {
    PyObject *value = NULL;
    int64_t n = 0;
    if (nargs && PyObject_TypeCheck(args[0], (PyTypeObject *)w->tensor_type)) {
        value = PyObject_GetAttr(args[0], nbytes_name);  /* all_reduce(t), broadcast(t, src) */
    } else {
        PyObject *tuple = PyTuple_New((Py_ssize_t)nargs);
        PyObject *kwargs = PyDict_New();
        if (tuple && kwargs) {
            for (size_t i = 0; i < nargs; i++) {
                Py_INCREF(args[i]);
                PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, args[i]);
            }
            Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
            int ok = 1;
            for (Py_ssize_t k = 0; k < nk && ok; k++)
                ok = PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) == 0;
            if (ok)
                value = PyObject_CallFunctionObjArgs(w->payload_bytes, tuple, kwargs, NULL);
        }
        Py_XDECREF(tuple);
        Py_XDECREF(kwargs);
    }
    if (value) n = PyLong_AsLongLong(value);
    Py_XDECREF(value);
    if (PyErr_Occurred())  /* the byte count is only evidence: 0 rather than an error */
        return clear_ordinary_error() ? 0 : -1;
    return n;
}

static PyObject *Wrapper_vectorcall(Wrapper *w, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    if (depth) return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    size_t nargs = PyVectorcall_NARGS(nargsf);
    Token tok;
    int64_t nbytes = payload_bytes(w, args, nargs, kwnames);
    if (nbytes < 0) return NULL;  /* Ctrl-C while sizing: before the collective starts */
    core_enter(w->core, w->op, nbytes, &tok);
    depth = 1;
    PyObject *result = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    depth = 0;
    if (result == NULL || result == Py_None) {
        core_exit(w->core, &tok);  /* done, or failed: the exception propagates */
        return result;
    }
    PyObject *token = token_tuple(&tok);
    if (token == NULL) {
        core_exit(w->core, &tok);
        if (clear_ordinary_error()) return result;
        Py_DECREF(result);
        return NULL;
    }
    PyObject *watched = PyObject_CallFunctionObjArgs(w->on_completion, result, token, NULL);
    Py_DECREF(token);
    if (watched == NULL) {
        /* on_completion records completion itself and raises only before it has
         * attached anything (see instrumentation._on_completion): exit here once. */
        core_exit(w->core, &tok);
        if (clear_ordinary_error()) return result;  /* hand back the bare result */
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(result);
    return watched;
}

static int Wrapper_init(Wrapper *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"original", "core", "op_code", "tensor_type", "payload_bytes",
                             "on_completion", NULL};
    PyObject *original, *core, *tensor_type, *pb, *oc;
    long long op;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!LO!OO", kwlist, &original, &CoreType, &core,
                                     &op, &PyType_Type, &tensor_type, &pb, &oc))
        return -1;
    if (!PyCallable_Check(original) || !PyCallable_Check(pb) || !PyCallable_Check(oc)) {
        PyErr_SetString(PyExc_TypeError, "original, payload_bytes and on_completion must be callable");
        return -1;
    }
    Py_INCREF(original); Py_XSETREF(self->original, original);
    Py_INCREF(core); Py_XSETREF(self->core, (Core *)core);
    Py_INCREF(tensor_type); Py_XSETREF(self->tensor_type, tensor_type);
    Py_INCREF(pb); Py_XSETREF(self->payload_bytes, pb);
    Py_INCREF(oc); Py_XSETREF(self->on_completion, oc);
    self->op = op;
    self->vectorcall = (vectorcallfunc)Wrapper_vectorcall;
    return 0;
}

static int Wrapper_traverse(Wrapper *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->original);
    Py_VISIT(self->core);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->payload_bytes);
    Py_VISIT(self->on_completion);
    return 0;
}

static int Wrapper_clear(Wrapper *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->original);
    Py_CLEAR(self->core);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->payload_bytes);
    Py_CLEAR(self->on_completion);
    return 0;
}

static void Wrapper_dealloc(Wrapper *self) {
    PyObject_GC_UnTrack(self);
    Wrapper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Wrapper_call(Wrapper *self, PyObject *args, PyObject *kwargs) {
    if (self->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "Wrapper was not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static PyMemberDef Wrapper_members[] = {
    {"__ddpwatch_original__", T_OBJECT, offsetof(Wrapper, original), READONLY,
     "the function this wraps"},
    {"__dictoffset__", T_PYSSIZET, offsetof(Wrapper, dict), READONLY},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Wrapper, vectorcall), READONLY},
    {NULL}
};

static PyGetSetDef Wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ddpwatch._hotpath.Wrapper",
    .tp_doc = "A torch.distributed function with entry and exit heartbeats "
              "(see instrumentation._wrap).",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Wrapper_init,
    .tp_dealloc = (destructor)Wrapper_dealloc,
    .tp_traverse = (traverseproc)Wrapper_traverse,
    .tp_clear = (inquiry)Wrapper_clear,
    .tp_call = (ternaryfunc)Wrapper_call,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_members = Wrapper_members,
    .tp_getset = Wrapper_getset,
};

/* -------------------------------------------------------- backend threads */
/* Completion callbacks run on the backend's own thread, where pybind11 would
 * create and delete a Python thread state per call (callbacks.py says what that
 * costs). One PyGILState_Ensure never released keeps it for the thread's life. */
static _Thread_local int thread_state_kept;

static PyObject *keep_thread_state(PyObject *module, PyObject *unused) {
    if (!thread_state_kept) {
        thread_state_kept = 1;
        (void)PyGILState_Ensure();
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------- the reader */
/* One seqlock read attempt, for the daemon: the record's first `size` bytes, or
 * None if seq was 0 (not yet published), odd (mid-write) or changed meanwhile.
 * The acquire load of seq before the copy and the acquire fence after it pair
 * with the writer's release fence and release store (seq_begin, seq_end), so the
 * copy is consistent on any CPU; Python code alone cannot order its loads and
 * relies on x86's total store order (heartbeat/reader.py keeps that fallback). */
static PyObject *read_once(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t seq_offset, size;
    if (!PyArg_ParseTuple(args, "y*nn:read_once", &view, &seq_offset, &size)) return NULL;
    if (seq_offset < 0 || seq_offset % 8 || seq_offset + 8 > view.len || size < 0
        || size > view.len || ((uintptr_t)view.buf) % 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "read_once: seq offset or size outside the buffer");
        return NULL;
    }
    const uint64_t *seqp = (const uint64_t *)((const char *)view.buf + seq_offset);
    uint64_t before = __atomic_load_n(seqp, __ATOMIC_ACQUIRE);
    PyObject *result = Py_None;
    if (before && !(before & 1)) {
        PyObject *copy = PyBytes_FromStringAndSize(NULL, size);
        if (!copy) {
            PyBuffer_Release(&view);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(copy), view.buf, (size_t)size);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seqp, __ATOMIC_RELAXED) == before) result = copy;
        else Py_DECREF(copy);
    }
    PyBuffer_Release(&view);
    if (result == Py_None) Py_INCREF(result);
    return result;
}

static PyMethodDef hotpath_functions[] = {
    {"keep_thread_state", keep_thread_state, METH_NOARGS,
     "keep_thread_state(): this (non-Python) thread keeps its Python thread state"},
    {"read_once", read_once, METH_VARARGS,
     "read_once(buffer, seq_offset, size) -> bytes | None: one seqlock read attempt"},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------- module */
static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "ddpwatch._hotpath",
    "The heartbeat hot path in C (see the top of _hotpath.c for why).", -1,
    hotpath_functions,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__hotpath(void) {
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&WrapperType) < 0) return NULL;
    nbytes_name = PyUnicode_InternFromString("nbytes");
    if (!nbytes_name) return NULL;
    PyObject *m = PyModule_Create(&hotpath_module);
    if (!m) return NULL;
    PyObject *names = PyTuple_New(N_FIELDS);
    if (!names) goto fail;
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *pair = Py_BuildValue("(sC)", FIELD_NAMES[i], FIELD_KINDS[i]);
        if (!pair) { Py_DECREF(names); goto fail; }
        PyTuple_SET_ITEM(names, i, pair);
    }
    if (PyModule_AddObject(m, "FIELDS", names) < 0) { Py_DECREF(names); goto fail; }
    if (PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0
        || PyModule_AddIntConstant(m, "RING_SLOT_SIZE", RING_SLOT_SIZE) < 0)
        goto fail;
    if (add_type(m, "Core", &CoreType) < 0 || add_type(m, "Wrapper", &WrapperType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
