/*
 * _loom.c - the CPython extension under the loom package: a Comm type over
 * loom_comm_t, a Request type over loom_request_t, and one method per
 * collective. Buffers cross without copies: anything with the buffer protocol
 * (NumPy arrays, bytearray, memoryview) or a DLPack capsule / __dlpack__ object
 * (PyTorch tensors: CPU ones, and CUDA ones where libloom was built with CUDA,
 * which then takes the device pointers itself, docs/gpu.md). The GIL is released for the whole of every call into
 * libloom that can block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <loom.h>

/* ---- DLPack (the ABI of dlpack.h v0.x, which every producer still speaks) ---- */

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

static PyObject *LoomError;
/* Whether the libloom this module links was built with CUDA (see
 * libloom_has_cuda): only then may a DLPack tensor's memory be CUDA memory. */
static int cuda_built;
/* The failures an elastic job recovers from by rolling back and rebuilding:
 * a peer lost, a revoked epoch, a transport failure, a peer that stopped
 * answering. Horovod's name for it is HorovodInternalError. */
static PyObject *LoomInternalError;

/* ---- buffers -------------------------------------------------------------- */

/* One side of a call: a buffer-protocol view or a DLPack capsule kept alive
 * (the capsule's own destructor returns the tensor to its producer). */
typedef struct {
    Py_buffer view;
    int has_view;
    PyObject *capsule;
    void *ptr;
    size_t nbytes;
    int dtype;          /* loom_dtype_t, or -1 when the format says nothing usable */
    char fmt[16];       /* for error messages */
} lbuf_t;

static void lbuf_release(lbuf_t *b)
{
    if (b->has_view) {
        PyBuffer_Release(&b->view);
        b->has_view = 0;
    }
    Py_CLEAR(b->capsule);
}

static int dtype_from_format(const char *f, Py_ssize_t itemsize)
{
    if (!f)
        return LOOM_UINT8;
    while (*f == '@' || *f == '=' || *f == '<' || *f == '!' || *f == '>')
        f++;
    if (f[0] == '\0' || f[1] != '\0')
        return -1;
    switch (f[0]) {
    case 'b': return LOOM_INT8;
    case 'h': return LOOM_INT16;
    case 'H': return LOOM_UINT16;
    case 'B': case '?': case 'c': return LOOM_UINT8;
    case 'e': return LOOM_FLOAT16;
    case 'f': return LOOM_FLOAT32;
    case 'd': return LOOM_FLOAT64;
    case 'i': case 'l': case 'q': case 'n':
        return itemsize == 4 ? LOOM_INT32 : itemsize == 8 ? LOOM_INT64 : -1;
    case 'I': case 'L': case 'Q': case 'N':
        return itemsize == 4 ? LOOM_UINT32 : itemsize == 8 ? LOOM_UINT64 : -1;
    default: return -1;
    }
}

static int dtype_from_dlpack(DLDataType t)
{
    if (t.lanes != 1)
        return -1;
    switch (t.code) {
    case kDLInt:
        return t.bits == 8 ? LOOM_INT8 : t.bits == 16 ? LOOM_INT16 : t.bits == 32 ? LOOM_INT32
             : t.bits == 64 ? LOOM_INT64 : -1;
    case kDLUInt:
        return t.bits == 8 ? LOOM_UINT8 : t.bits == 16 ? LOOM_UINT16 : t.bits == 32 ? LOOM_UINT32
             : t.bits == 64 ? LOOM_UINT64 : -1;
    case kDLFloat: return t.bits == 16 ? LOOM_FLOAT16 : t.bits == 32 ? LOOM_FLOAT32 : t.bits == 64 ? LOOM_FLOAT64 : -1;
    case kDLBfloat: return t.bits == 16 ? LOOM_BFLOAT16 : -1;
    case kDLBool: return t.bits == 8 ? LOOM_UINT8 : -1;
    default: return -1;
    }
}

static int lbuf_from_capsule(PyObject *cap, lbuf_t *b, const char *what)
{
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (!m)
        return -1;
    DLTensor *t = &m->dl_tensor;
    if (t->device.device_type == kDLCUDA && !cuda_built) {
        /* Handed to a libloom without CUDA, the device pointer would be read
         * as host memory: a fault, not an error. */
        PyErr_Format(PyExc_ValueError,
                     "%s: the tensor is in CUDA memory (device %d), but the libloom loom._loom "
                     "links was built without CUDA (configure --with-cuda)",
                     what, (int)t->device.device_id);
        return -1;
    }
    if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost &&
        t->device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the tensor lives on device type %d; loom takes CPU and CUDA memory only",
                     what, (int)t->device.device_type);
        return -1;
    }
    /* Row-major without gaps: strides absent, or each the product of the
     * dimensions after it (dimensions of extent 1 may carry any stride). */
    int64_t n = 1, expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->strides && t->shape[i] != 1 && t->strides[i] != expect) {
            PyErr_Format(PyExc_ValueError, "%s: the tensor is not contiguous", what);
            return -1;
        }
        expect *= t->shape[i];
        n *= t->shape[i];
    }
    b->dtype = dtype_from_dlpack(t->dtype);
    snprintf(b->fmt, sizeof b->fmt, "dl%u:%u", t->dtype.code, t->dtype.bits);
    b->ptr = (char *)t->data + t->byte_offset;
    b->nbytes = (size_t)n * ((t->dtype.bits * t->dtype.lanes + 7) / 8);
    Py_INCREF(cap);
    b->capsule = cap;
    return 0;
}

/* Take obj's memory; writable asks for a buffer loom may write into. */
static int lbuf_get(PyObject *obj, int writable, lbuf_t *b, const char *what)
{
    memset(b, 0, sizeof *b);
    b->dtype = -1;
    if (PyCapsule_IsValid(obj, "dltensor"))
        return lbuf_from_capsule(obj, b, what);
    if (!PyObject_CheckBuffer(obj) && PyObject_HasAttrString(obj, "__dlpack__")) {
        PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
        if (!cap)
            return -1;
        int r = PyCapsule_IsValid(cap, "dltensor") ? lbuf_from_capsule(cap, b, what) : -1;
        if (r < 0 && !PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return a DLPack capsule", what);
        Py_DECREF(cap);
        return r;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_TypeError, "%s: need a contiguous%s buffer or DLPack tensor (%S)",
                     what, writable ? " writable" : "", value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    b->has_view = 1;
    b->ptr = b->view.buf;
    b->nbytes = (size_t)b->view.len;
    b->dtype = dtype_from_format(b->view.format, b->view.itemsize);
    snprintf(b->fmt, sizeof b->fmt, "%s", b->view.format ? b->view.format : "B");
    return 0;
}

/* The element type of a call: dt_arg when given (>= 0), else the buffers'. */
static int resolve_dtype(int dt_arg, lbuf_t *a, lbuf_t *b, const char *what)
{
    int dt = dt_arg;
    if (dt < 0) {
        lbuf_t *src = a ? a : b;
        dt = src->dtype;
        if (dt < 0) {
            PyErr_Format(PyExc_TypeError,
                         "%s: element format '%s' has no loom type; pass dtype=", what, src->fmt);
            return -1;
        }
        if (a && b && b->dtype >= 0 && b->dtype != dt) {
            PyErr_Format(PyExc_TypeError, "%s: send and receive buffers differ in type", what);
            return -1;
        }
    } else if (dt >= LOOM_NUM_DTYPES) {
        PyErr_Format(PyExc_ValueError, "%s: unknown dtype %d", what, dt);
        return -1;
    }
    size_t es = loom_dtype_size((loom_dtype_t)dt);
    if ((a && a->nbytes % es) || (b && b->nbytes % es)) {
        PyErr_Format(PyExc_ValueError, "%s: buffer size is not a multiple of the element size %zu",
                     what, es);
        return -1;
    }
    return dt;
}

static int check_op(int op)
{
    if (op < 0 || op >= LOOM_NUM_OPS) {
        PyErr_Format(PyExc_ValueError, "unknown reduction op %d", op);
        return -1;
    }
    return 0;
}

/* Counts for the v-variants, copied into a C array the request keeps. */
static size_t *counts_from_seq(PyObject *seq, int n, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "counts must be a sequence");
    if (!fast)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s: %d counts needed, got %zd", what, n,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return NULL;
    }
    size_t *c = PyMem_Calloc((size_t)n * 2 + 1, sizeof *c);
    if (!c) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s: negative count", what);
            PyMem_Free(c);
            Py_DECREF(fast);
            return NULL;
        }
        c[i] = (size_t)v;
    }
    Py_DECREF(fast);
    /* displacements after the counts: packed, in rank order */
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        c[n + i] = off;
        off += c[i];
    }
    c[2 * n] = off;
    return c;
}

/* ---- Comm ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    loom_comm_t comm;
    /* libloom runs a blocking call directly on the calling thread when nothing
     * is queued: two Python threads submitting on one communicator at once
     * must not both take that path. */
    PyThread_type_lock lock;
    Py_ssize_t pending;      /* requests not yet finished */
} CommObject;

typedef struct {
    PyObject_HEAD
    CommObject *comm;
    loom_request_t req;
    lbuf_t a, b;
    size_t *counts[2];
    int finished;
    int in_wait;         /* a thread is inside loom_wait without the GIL */
    int status;
} RequestObject;

static PyTypeObject CommType;
static PyTypeObject RequestType;

static PyObject *raise_status(loom_comm_t c, loom_status_t st, const char *what)
{
    const char *detail = loom_comm_last_error(c);
    PyObject *msg = PyUnicode_FromFormat("%s: %s%s%s", what, loom_strerror(st),
                                         detail && *detail ? ": " : "", detail ? detail : "");
    if (!msg)
        return NULL;
    /* LoomError(message) with .status set, so str(e) reads naturally. */
    PyObject *cls = st == LOOM_ERR_PEER_LOST || st == LOOM_ERR_TRANSPORT || st == LOOM_ERR_TIMEOUT
                        ? LoomInternalError : LoomError;
    PyObject *exc = PyObject_CallFunctionObjArgs(cls, msg, NULL);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    PyObject *s = PyLong_FromLong((long)st);
    if (s) {
        PyObject_SetAttrString(exc, "status", s);
        Py_DECREF(s);
    }
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

static int comm_ok(CommObject *self)
{
    if (!self->comm) {
        PyErr_SetString(PyExc_ValueError, "the communicator is closed");
        return 0;
    }
    return 1;
}

static void comm_lock(CommObject *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void comm_unlock(CommObject *self) { PyThread_release_lock(self->lock); }

static PyObject *Comm_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "size", "store", "timeout", NULL};
    int rank = -1, size = -1;
    const char *store = NULL;
    double timeout = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iizd", kwlist, &rank, &size, &store, &timeout))
        return NULL;
    CommObject *self = (CommObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    loom_status_t st;
    loom_comm_t c = NULL;
    if (rank < 0 && size < 0 && !store && timeout == 0.0) {
        Py_BEGIN_ALLOW_THREADS
        st = loom_init(&c);
        Py_END_ALLOW_THREADS
    } else {
        loom_config_t cfg = LOOM_CONFIG_INIT;
        cfg.rank = rank;
        cfg.size = size;
        cfg.store = store;
        cfg.timeout_s = timeout;
        Py_BEGIN_ALLOW_THREADS
        st = loom_comm_create(&cfg, &c);
        Py_END_ALLOW_THREADS
    }
    if (st != LOOM_SUCCESS) {
        Py_DECREF(self);
        return raise_status(NULL, st, "loom init");
    }
    self->comm = c;
    return (PyObject *)self;
}

static loom_status_t comm_destroy(CommObject *self)
{
    loom_status_t st = LOOM_SUCCESS;
    if (self->comm) {
        loom_comm_t c = self->comm;
        self->comm = NULL;
        Py_BEGIN_ALLOW_THREADS
        st = loom_comm_destroy(c);
        Py_END_ALLOW_THREADS
    }
    return st;
}

static void Comm_dealloc(CommObject *self)
{
    /* Requests hold a reference to their Comm, so none is pending here. */
    comm_destroy(self);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Comm_close(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (self->pending) {
        PyErr_Format(PyExc_RuntimeError,
                     "close: %zd non-blocking operations are not finished; wait for them first",
                     self->pending);
        return NULL;
    }
    comm_lock(self);
    loom_status_t st = comm_destroy(self);
    comm_unlock(self);
    if (st != LOOM_SUCCESS)
        return raise_status(NULL, st, "close");
    Py_RETURN_NONE;
}

static PyObject *Comm_abort(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (!comm_ok(self))
        return NULL;
    /* Deliberately without the lock: abort exists to unblock a call holding it. */
    loom_status_t st = loom_comm_abort(self->comm);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "abort");
    Py_RETURN_NONE;
}

#define COMM_INT_GETTER(name)                                          \
    static PyObject *Comm_get_##name(CommObject *self, void *closure)  \
    {                                                                  \
        (void)closure;                                                 \
        if (!comm_ok(self))                                            \
            return NULL;                                               \
        return PyLong_FromLong(loom_comm_##name(self->comm));          \
    }
COMM_INT_GETTER(rank)
COMM_INT_GETTER(size)
COMM_INT_GETTER(local_rank)
COMM_INT_GETTER(local_size)
COMM_INT_GETTER(node_rank)
COMM_INT_GETTER(node_count)

static PyObject *Comm_get_closed(CommObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->comm == NULL);
}

/* A Python Comm owning out (destroyed here when that fails). */
static PyObject *wrap_comm(loom_comm_t out)
{
    CommObject *child = (CommObject *)CommType.tp_alloc(&CommType, 0);
    if (!child) {
        loom_comm_destroy(out);
        return NULL;
    }
    child->lock = PyThread_allocate_lock();
    if (!child->lock) {
        loom_comm_destroy(out);
        Py_DECREF(child);
        return PyErr_NoMemory();
    }
    child->comm = out;
    return (PyObject *)child;
}

static PyObject *Comm_split(CommObject *self, PyObject *args)
{
    int color, key;
    if (!PyArg_ParseTuple(args, "ii", &color, &key) || !comm_ok(self))
        return NULL;
    loom_comm_t out = NULL;
    loom_status_t st;
    comm_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = loom_comm_split(self->comm, color < 0 ? LOOM_UNDEFINED : color, key, &out);
    Py_END_ALLOW_THREADS
    comm_unlock(self);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "split");
    if (!out)
        Py_RETURN_NONE;
    return wrap_comm(out);
}

static PyObject *Comm_revoke(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (!comm_ok(self))
        return NULL;
    /* Without the lock, like abort: it exists to free a thread blocked in a call. */
    loom_status_t st = loom_comm_revoke(self->comm);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "revoke");
    Py_RETURN_NONE;
}

static PyObject *Comm_rebuild(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (!comm_ok(self))
        return NULL;
    /* Revoke first: a thread blocked in a call on self holds the lock. */
    loom_comm_revoke(self->comm);
    loom_comm_t out = NULL;
    loom_status_t st;
    comm_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = loom_comm_rebuild(self->comm, &out);
    Py_END_ALLOW_THREADS
    comm_unlock(self);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "rebuild");
    return wrap_comm(out);
}

static PyObject *Comm_join_pending(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (!comm_ok(self))
        return NULL;
    int pending = 0;
    loom_status_t st;
    comm_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = loom_comm_join_pending(self->comm, &pending);
    Py_END_ALLOW_THREADS
    comm_unlock(self);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "join_pending");
    return PyLong_FromLong(pending);
}

/* Not collective and without the communicator's lock: a rank polls it while
 * its engine thread runs collectives on the same communicator. */
static PyObject *Comm_join_waiting(CommObject *self, PyObject *unused)
{
    (void)unused;
    if (!comm_ok(self))
        return NULL;
    int waiting = 0;
    loom_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = loom_comm_join_waiting(self->comm, &waiting);
    Py_END_ALLOW_THREADS
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "join_waiting");
    return PyLong_FromLong(waiting);
}

static PyObject *Comm_get_epoch(CommObject *self, void *closure)
{
    (void)closure;
    if (!comm_ok(self))
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)loom_comm_epoch(self->comm));
}

/* ---- calling a collective ---------------------------------------------------
 * Every collective method parses its arguments into a call_t, then call_run()
 * either runs it blocking (GIL released) or starts it and returns a Request. */

typedef enum {
    C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_ALLGATHERV, C_REDUCE_SCATTER,
    C_ALLTOALL, C_ALLTOALLV, C_GATHER, C_SCATTER, C_BARRIER, C_SEND, C_RECV
} coll_t;

typedef struct {
    coll_t coll;
    const char *name;
    lbuf_t a, b;         /* a: send (or the only buffer), b: receive */
    int has_a, has_b;
    int dt, op, root, peer, tag;
    size_t count;        /* elements, as the C call takes them */
    size_t *counts[2];   /* v-variants: [0] recv (or send) counts+displs, [1] recv */
} call_t;

static void call_release(call_t *k)
{
    if (k->has_a)
        lbuf_release(&k->a);
    if (k->has_b)
        lbuf_release(&k->b);
    PyMem_Free(k->counts[0]);
    PyMem_Free(k->counts[1]);
    k->has_a = k->has_b = 0;
    k->counts[0] = k->counts[1] = NULL;
}

static loom_status_t call_start(CommObject *self, call_t *k, loom_request_t *req)
{
    loom_comm_t c = self->comm;
    loom_dtype_t dt = (loom_dtype_t)k->dt;
    loom_op_t op = (loom_op_t)k->op;
    const void *s = k->has_a ? k->a.ptr : LOOM_IN_PLACE;
    void *r = k->has_b ? k->b.ptr : NULL;
    int n = loom_comm_size(c);
    size_t *cv = k->counts[0], *cv2 = k->counts[1];
    switch (k->coll) {
    case C_ALLREDUCE:
        return req ? loom_iallreduce(s, r, k->count, dt, op, c, req) : loom_allreduce(s, r, k->count, dt, op, c);
    case C_BROADCAST:
        return req ? loom_ibroadcast(r, k->count, dt, k->root, c, req) : loom_broadcast(r, k->count, dt, k->root, c);
    case C_REDUCE:
        return req ? loom_ireduce(s, r, k->count, dt, op, k->root, c, req) : loom_reduce(s, r, k->count, dt, op, k->root, c);
    case C_ALLGATHER:
        return req ? loom_iallgather(s, r, k->count, dt, c, req) : loom_allgather(s, r, k->count, dt, c);
    case C_ALLGATHERV:
        return req ? loom_iallgatherv(s, k->count, r, cv, cv + n, dt, c, req)
                   : loom_allgatherv(s, k->count, r, cv, cv + n, dt, c);
    case C_REDUCE_SCATTER:
        return req ? loom_ireduce_scatter(s, r, k->count, dt, op, c, req) : loom_reduce_scatter(s, r, k->count, dt, op, c);
    case C_ALLTOALL:
        return req ? loom_ialltoall(s, r, k->count, dt, c, req) : loom_alltoall(s, r, k->count, dt, c);
    case C_ALLTOALLV:
        return req ? loom_ialltoallv(s, cv, cv + n, r, cv2, cv2 + n, dt, c, req)
                   : loom_alltoallv(s, cv, cv + n, r, cv2, cv2 + n, dt, c);
    case C_GATHER:
        return req ? loom_igather(s, r, k->count, dt, k->root, c, req) : loom_gather(s, r, k->count, dt, k->root, c);
    case C_SCATTER:
        return req ? loom_iscatter(s, r, k->count, dt, k->root, c, req) : loom_scatter(s, r, k->count, dt, k->root, c);
    case C_BARRIER:
        return req ? loom_ibarrier(c, req) : loom_barrier(c);
    case C_SEND:
        return req ? loom_isend(s, k->count, dt, k->peer, k->tag, c, req) : loom_send(s, k->count, dt, k->peer, k->tag, c);
    case C_RECV:
        return req ? loom_irecv(r, k->count, dt, k->peer, k->tag, c, req) : loom_recv(r, k->count, dt, k->peer, k->tag, c);
    }
    return LOOM_ERR_INTERNAL;
}

/* Consumes k (its buffers move into the Request, or are released). */
static PyObject *call_run(CommObject *self, call_t *k, int nonblocking)
{
    loom_status_t st;
    if (!nonblocking) {
        comm_lock(self);
        Py_BEGIN_ALLOW_THREADS
        st = call_start(self, k, NULL);
        Py_END_ALLOW_THREADS
        comm_unlock(self);
        call_release(k);
        if (st != LOOM_SUCCESS)
            return raise_status(self->comm, st, k->name);
        Py_RETURN_NONE;
    }
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r) {
        call_release(k);
        return NULL;
    }
    r->comm = NULL;
    r->req = NULL;
    r->finished = 1;
    r->in_wait = 0;
    r->status = 0;
    memset(&r->a, 0, sizeof r->a);
    memset(&r->b, 0, sizeof r->b);
    r->counts[0] = r->counts[1] = NULL;
    loom_request_t req = NULL;
    comm_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = call_start(self, k, &req);
    Py_END_ALLOW_THREADS
    comm_unlock(self);
    if (st != LOOM_SUCCESS) {
        call_release(k);
        Py_DECREF(r);
        return raise_status(self->comm, st, k->name);
    }
    /* The request now owns the memory libloom reads and writes. */
    r->a = k->a;
    r->b = k->b;
    if (!k->has_a)
        memset(&r->a, 0, sizeof r->a);
    if (!k->has_b)
        memset(&r->b, 0, sizeof r->b);
    r->counts[0] = k->counts[0];
    r->counts[1] = k->counts[1];
    k->has_a = k->has_b = 0;
    k->counts[0] = k->counts[1] = NULL;
    Py_INCREF(self);
    r->comm = self;
    r->req = req;
    r->finished = 0;
    self->pending++;
    return (PyObject *)r;
}

static int get_a(call_t *k, PyObject *o, int writable)
{
    if (lbuf_get(o, writable, &k->a, k->name) < 0)
        return -1;
    k->has_a = 1;
    return 0;
}

static int get_b(call_t *k, PyObject *o)
{
    if (lbuf_get(o, 1, &k->b, k->name) < 0)
        return -1;
    k->has_b = 1;
    return 0;
}

/* A send object that is None or the receive object itself means in place. */
static int is_in_place(PyObject *send, PyObject *recv) { return send == Py_None || send == recv; }

static PyObject *fail_call(call_t *k)
{
    call_release(k);
    return NULL;
}

static size_t elems(lbuf_t *b, int dt) { return b->nbytes / loom_dtype_size((loom_dtype_t)dt); }

#define NB_KW "nonblocking"

/* allreduce(send, recv, op=SUM, dtype=-1, nonblocking=False) */
static PyObject *Comm_allreduce(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "op", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int op = LOOM_SUM, dt = -1, nb = 0;
    call_t k = {.coll = C_ALLREDUCE, .name = "allreduce"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iip", kwlist, &send, &recv, &op, &dt, &nb) ||
        !comm_ok(self) || check_op(op) < 0)
        return NULL;
    if ((!is_in_place(send, recv) && get_a(&k, send, 0) < 0) || get_b(&k, recv) < 0)
        return fail_call(&k);
    if ((k.dt = resolve_dtype(dt, k.has_a ? &k.a : NULL, &k.b, k.name)) < 0)
        return fail_call(&k);
    if (k.has_a && k.a.nbytes != k.b.nbytes) {
        PyErr_Format(PyExc_ValueError, "allreduce: send has %zu bytes, recv %zu", k.a.nbytes, k.b.nbytes);
        return fail_call(&k);
    }
    k.op = op;
    k.count = elems(&k.b, k.dt);
    return call_run(self, &k, nb);
}

/* gated_allreduce(flags, slot, keep, buf, op, dtype): the loom engine's cached
 * round for one tensor (python/loom/_engine.py), both collectives under one
 * release of the GIL: a Python thread that waits to take the GIL back may
 * wait a whole switch interval, and the Python that ran between the two
 * calls delayed the second on every rank. */
static PyObject *Comm_gated_allreduce(CommObject *self, PyObject *args)
{
    PyObject *flags, *buf;
    int slot, keep, op, dt;
    unsigned char before[64];
    call_t f = {.coll = C_ALLREDUCE, .name = "allreduce"};
    call_t k = {.coll = C_ALLREDUCE, .name = "allreduce"};
    if (!PyArg_ParseTuple(args, "OiiOii", &flags, &slot, &keep, &buf, &op, &dt) || !comm_ok(self) ||
        check_op(op) < 0)
        return NULL;
    if (get_b(&f, flags) < 0)
        return fail_call(&f);
    if (slot < 1 || (size_t)slot >= f.b.nbytes || keep < 1 || keep > slot ||
        (size_t)keep > sizeof before) {
        PyErr_Format(PyExc_ValueError, "gated_allreduce: slot %d, keep %d for %zu flag bytes",
                     slot, keep, f.b.nbytes);
        return fail_call(&f);
    }
    if (get_b(&k, buf) < 0 || (k.dt = resolve_dtype(dt, NULL, &k.b, k.name)) < 0) {
        call_release(&f);
        return fail_call(&k);
    }
    unsigned char *fl = f.b.ptr;
    memcpy(before, fl, (size_t)keep);
    loom_comm_t c = self->comm;
    loom_status_t st;
    int ran = 0;
    comm_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = loom_allreduce(LOOM_IN_PLACE, fl, f.b.nbytes, LOOM_UINT8, LOOM_MIN, c);
    if (st == LOOM_SUCCESS && fl[0] && fl[slot] && !memcmp(fl + 1, before + 1, (size_t)keep - 1)) {
        ran = 1;
        st = loom_allreduce(LOOM_IN_PLACE, k.b.ptr, elems(&k.b, k.dt), (loom_dtype_t)k.dt,
                            (loom_op_t)op, c);
    }
    Py_END_ALLOW_THREADS
    comm_unlock(self);
    int result = !fl[0] ? 0 : ran ? 2 : 1;
    call_release(&f);
    call_release(&k);
    if (st != LOOM_SUCCESS)
        return raise_status(self->comm, st, "allreduce");
    return PyLong_FromLong(result);
}

/* reduce(send, recv, op, root, dtype, nonblocking): recv used at root only */
static PyObject *Comm_reduce(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "op", "root", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int op = LOOM_SUM, root = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_REDUCE, .name = "reduce"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iiip", kwlist, &send, &recv, &op, &root, &dt, &nb) ||
        !comm_ok(self) || check_op(op) < 0)
        return NULL;
    if ((!is_in_place(send, recv) && get_a(&k, send, 0) < 0) || get_b(&k, recv) < 0)
        return fail_call(&k);
    if ((k.dt = resolve_dtype(dt, k.has_a ? &k.a : NULL, &k.b, k.name)) < 0)
        return fail_call(&k);
    if (k.has_a && k.a.nbytes != k.b.nbytes) {
        PyErr_Format(PyExc_ValueError, "reduce: send has %zu bytes, recv %zu", k.a.nbytes, k.b.nbytes);
        return fail_call(&k);
    }
    k.op = op;
    k.root = root;
    k.count = elems(&k.b, k.dt);
    return call_run(self, &k, nb);
}

/* broadcast(buf, root=0, dtype, nonblocking) */
static PyObject *Comm_broadcast(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buf", "root", "dtype", NB_KW, NULL};
    PyObject *buf;
    int root = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_BROADCAST, .name = "broadcast"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|iip", kwlist, &buf, &root, &dt, &nb) || !comm_ok(self))
        return NULL;
    if (get_b(&k, buf) < 0 || (k.dt = resolve_dtype(dt, NULL, &k.b, k.name)) < 0)
        return fail_call(&k);
    k.root = root;
    k.count = elems(&k.b, k.dt);
    return call_run(self, &k, nb);
}

/* The shared shape of allgather / alltoall / gather / scatter / reduce_scatter:
 * one buffer is size times the other. big_is_recv says which. */
static PyObject *blocked_call(CommObject *self, call_t *k, PyObject *send, PyObject *recv, int dt,
                              int nb, int big_is_recv, int in_place_ok)
{
    int n = loom_comm_size(self->comm);
    int in_place = in_place_ok && is_in_place(send, recv);
    if ((!in_place && get_a(k, send, 0) < 0) || get_b(k, recv) < 0)
        return fail_call(k);
    if ((k->dt = resolve_dtype(dt, k->has_a ? &k->a : NULL, &k->b, k->name)) < 0)
        return fail_call(k);
    size_t recv_n = elems(&k->b, k->dt);
    if (in_place) {
        if (recv_n % (size_t)n) {
            PyErr_Format(PyExc_ValueError, "%s: buffer of %zu elements does not split over %d ranks",
                         k->name, recv_n, n);
            return fail_call(k);
        }
        k->count = recv_n / (size_t)n;
        return call_run(self, k, nb);
    }
    size_t send_n = elems(&k->a, k->dt);
    size_t small = big_is_recv ? send_n : recv_n, big = big_is_recv ? recv_n : send_n;
    if (big != small * (size_t)n) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zu elements, expected %d x %zu = %zu", k->name,
                     big_is_recv ? "recv" : "send", big, n, small, small * (size_t)n);
        return fail_call(k);
    }
    k->count = small;
    return call_run(self, k, nb);
}

/* allgather(send, recv, dtype, nonblocking): recv = size x send */
static PyObject *Comm_allgather(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int dt = -1, nb = 0;
    call_t k = {.coll = C_ALLGATHER, .name = "allgather"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|ip", kwlist, &send, &recv, &dt, &nb) || !comm_ok(self))
        return NULL;
    return blocked_call(self, &k, send, recv, dt, nb, 1, 1);
}

/* alltoall(send, recv, dtype, nonblocking): equal sizes, count = n / size */
static PyObject *Comm_alltoall(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int dt = -1, nb = 0;
    call_t k = {.coll = C_ALLTOALL, .name = "alltoall"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|ip", kwlist, &send, &recv, &dt, &nb) || !comm_ok(self))
        return NULL;
    int n = loom_comm_size(self->comm);
    if (get_a(&k, send, 0) < 0 || get_b(&k, recv) < 0)
        return fail_call(&k);
    if ((k.dt = resolve_dtype(dt, &k.a, &k.b, k.name)) < 0)
        return fail_call(&k);
    size_t sn = elems(&k.a, k.dt);
    if (sn != elems(&k.b, k.dt) || sn % (size_t)n) {
        PyErr_Format(PyExc_ValueError, "alltoall: send and recv need equal sizes divisible by %d", n);
        return fail_call(&k);
    }
    k.count = sn / (size_t)n;
    return call_run(self, &k, nb);
}

/* gather(send, recv, root, dtype, nonblocking): recv (root only) = size x send;
 * recv may be None off the root. */
static PyObject *Comm_gather(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "root", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int root = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_GATHER, .name = "gather"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iip", kwlist, &send, &recv, &root, &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    k.root = root;
    if (recv == Py_None) {
        if (get_a(&k, send, 0) < 0 || (k.dt = resolve_dtype(dt, &k.a, NULL, k.name)) < 0)
            return fail_call(&k);
        k.count = elems(&k.a, k.dt);
        return call_run(self, &k, nb);
    }
    return blocked_call(self, &k, send, recv, dt, nb, 1, 0);
}

/* scatter(send, recv, root, dtype, nonblocking): send (root only) = size x recv */
static PyObject *Comm_scatter(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "root", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int root = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_SCATTER, .name = "scatter"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iip", kwlist, &send, &recv, &root, &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    k.root = root;
    if (send == Py_None) {
        if (get_b(&k, recv) < 0 || (k.dt = resolve_dtype(dt, NULL, &k.b, k.name)) < 0)
            return fail_call(&k);
        k.count = elems(&k.b, k.dt);
        return call_run(self, &k, nb);
    }
    return blocked_call(self, &k, send, recv, dt, nb, 0, 0);
}

/* reduce_scatter(send, recv, op, dtype, nonblocking): send = size x recv */
static PyObject *Comm_reduce_scatter(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "op", "dtype", NB_KW, NULL};
    PyObject *send, *recv;
    int op = LOOM_SUM, dt = -1, nb = 0;
    call_t k = {.coll = C_REDUCE_SCATTER, .name = "reduce_scatter"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iip", kwlist, &send, &recv, &op, &dt, &nb) ||
        !comm_ok(self) || check_op(op) < 0)
        return NULL;
    k.op = op;
    return blocked_call(self, &k, send, recv, dt, nb, 0, 0);
}

/* allgatherv(send, recv, recvcounts, dtype, nonblocking): blocks packed in rank order */
static PyObject *Comm_allgatherv(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "recv", "recvcounts", "dtype", NB_KW, NULL};
    PyObject *send, *recv, *counts;
    int dt = -1, nb = 0;
    call_t k = {.coll = C_ALLGATHERV, .name = "allgatherv"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|ip", kwlist, &send, &recv, &counts, &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    int n = loom_comm_size(self->comm);
    if (get_a(&k, send, 0) < 0 || get_b(&k, recv) < 0)
        return fail_call(&k);
    if ((k.dt = resolve_dtype(dt, &k.a, &k.b, k.name)) < 0 ||
        !(k.counts[0] = counts_from_seq(counts, n, k.name)))
        return fail_call(&k);
    if (k.counts[0][2 * n] != elems(&k.b, k.dt)) {
        PyErr_Format(PyExc_ValueError, "allgatherv: recv has %zu elements, the counts sum to %zu",
                     elems(&k.b, k.dt), k.counts[0][2 * n]);
        return fail_call(&k);
    }
    k.count = elems(&k.a, k.dt);
    return call_run(self, &k, nb);
}

/* alltoallv(send, sendcounts, recv, recvcounts, dtype, nonblocking) */
static PyObject *Comm_alltoallv(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"send", "sendcounts", "recv", "recvcounts", "dtype", NB_KW, NULL};
    PyObject *send, *recv, *scounts, *rcounts;
    int dt = -1, nb = 0;
    call_t k = {.coll = C_ALLTOALLV, .name = "alltoallv"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|ip", kwlist, &send, &scounts, &recv, &rcounts,
                                     &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    int n = loom_comm_size(self->comm);
    if (get_a(&k, send, 0) < 0 || get_b(&k, recv) < 0)
        return fail_call(&k);
    if ((k.dt = resolve_dtype(dt, &k.a, &k.b, k.name)) < 0 ||
        !(k.counts[0] = counts_from_seq(scounts, n, k.name)) ||
        !(k.counts[1] = counts_from_seq(rcounts, n, k.name)))
        return fail_call(&k);
    if (k.counts[0][2 * n] != elems(&k.a, k.dt) || k.counts[1][2 * n] != elems(&k.b, k.dt)) {
        PyErr_Format(PyExc_ValueError, "alltoallv: buffer sizes differ from the sums of the counts");
        return fail_call(&k);
    }
    return call_run(self, &k, nb);
}

static PyObject *Comm_barrier(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {NB_KW, NULL};
    int nb = 0;
    call_t k = {.coll = C_BARRIER, .name = "barrier"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &nb) || !comm_ok(self))
        return NULL;
    return call_run(self, &k, nb);
}

static PyObject *Comm_send(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buf", "peer", "tag", "dtype", NB_KW, NULL};
    PyObject *buf;
    int peer, tag = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_SEND, .name = "send"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|iip", kwlist, &buf, &peer, &tag, &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    if (get_a(&k, buf, 0) < 0 || (k.dt = resolve_dtype(dt, &k.a, NULL, k.name)) < 0)
        return fail_call(&k);
    k.peer = peer;
    k.tag = tag;
    k.count = elems(&k.a, k.dt);
    return call_run(self, &k, nb);
}

static PyObject *Comm_recv(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buf", "peer", "tag", "dtype", NB_KW, NULL};
    PyObject *buf;
    int peer, tag = 0, dt = -1, nb = 0;
    call_t k = {.coll = C_RECV, .name = "recv"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|iip", kwlist, &buf, &peer, &tag, &dt, &nb) ||
        !comm_ok(self))
        return NULL;
    if (get_b(&k, buf) < 0 || (k.dt = resolve_dtype(dt, NULL, &k.b, k.name)) < 0)
        return fail_call(&k);
    k.peer = peer;
    k.tag = tag;
    k.count = elems(&k.b, k.dt);
    return call_run(self, &k, nb);
}

static PyMethodDef Comm_methods[] = {
    {"close", (PyCFunction)Comm_close, METH_NOARGS, "Destroy the communicator (idempotent)."},
    {"abort", (PyCFunction)Comm_abort, METH_NOARGS, "Fail every pending and later operation."},
    {"split", (PyCFunction)Comm_split, METH_VARARGS,
     "split(color, key) -> Comm or None (color < 0: not a member)."},
    {"revoke", (PyCFunction)Comm_revoke, METH_NOARGS,
     "Give up on this communicator on every rank (elastic jobs: the whole epoch)."},
    {"rebuild", (PyCFunction)Comm_rebuild, METH_NOARGS,
     "rebuild() -> Comm of the next elastic epoch (survivors first, then newcomers)."},
    {"join_pending", (PyCFunction)Comm_join_pending, METH_NOARGS,
     "Collective: how many processes wait to join the next epoch (0 unless elastic)."},
    {"join_waiting", (PyCFunction)Comm_join_waiting, METH_NOARGS,
     "Not collective: how many processes wait to join, as this rank reads the store now."},
    {"allreduce", (PyCFunction)(void (*)(void))Comm_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(send, recv, op=SUM, dtype=-1, nonblocking=False); send None or recv: in place."},
    {"gated_allreduce", (PyCFunction)Comm_gated_allreduce, METH_VARARGS,
     "gated_allreduce(flags, slot, keep, buf, op, dtype) -> 0, 1 or 2: allreduce flags (bytes, MIN) in\n"
     "place; then, when flags[0] and flags[slot] are set and flags[1:keep] came back unchanged (the\n"
     "same on every rank), allreduce buf in place. 0: flags[0] was clear; 1: buf left alone; 2: reduced."},
    {"reduce", (PyCFunction)(void (*)(void))Comm_reduce, METH_VARARGS | METH_KEYWORDS,
     "reduce(send, recv, op=SUM, root=0, dtype=-1, nonblocking=False)"},
    {"broadcast", (PyCFunction)(void (*)(void))Comm_broadcast, METH_VARARGS | METH_KEYWORDS,
     "broadcast(buf, root=0, dtype=-1, nonblocking=False)"},
    {"allgather", (PyCFunction)(void (*)(void))Comm_allgather, METH_VARARGS | METH_KEYWORDS,
     "allgather(send, recv, dtype=-1, nonblocking=False); recv holds size x send."},
    {"allgatherv", (PyCFunction)(void (*)(void))Comm_allgatherv, METH_VARARGS | METH_KEYWORDS,
     "allgatherv(send, recv, recvcounts, dtype=-1, nonblocking=False)"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))Comm_reduce_scatter, METH_VARARGS | METH_KEYWORDS,
     "reduce_scatter(send, recv, op=SUM, dtype=-1, nonblocking=False); send holds size x recv."},
    {"alltoall", (PyCFunction)(void (*)(void))Comm_alltoall, METH_VARARGS | METH_KEYWORDS,
     "alltoall(send, recv, dtype=-1, nonblocking=False)"},
    {"alltoallv", (PyCFunction)(void (*)(void))Comm_alltoallv, METH_VARARGS | METH_KEYWORDS,
     "alltoallv(send, sendcounts, recv, recvcounts, dtype=-1, nonblocking=False)"},
    {"gather", (PyCFunction)(void (*)(void))Comm_gather, METH_VARARGS | METH_KEYWORDS,
     "gather(send, recv, root=0, dtype=-1, nonblocking=False); recv may be None off the root."},
    {"scatter", (PyCFunction)(void (*)(void))Comm_scatter, METH_VARARGS | METH_KEYWORDS,
     "scatter(send, recv, root=0, dtype=-1, nonblocking=False); send may be None off the root."},
    {"barrier", (PyCFunction)(void (*)(void))Comm_barrier, METH_VARARGS | METH_KEYWORDS,
     "barrier(nonblocking=False)"},
    {"send", (PyCFunction)(void (*)(void))Comm_send, METH_VARARGS | METH_KEYWORDS,
     "send(buf, peer, tag=0, dtype=-1, nonblocking=False)"},
    {"recv", (PyCFunction)(void (*)(void))Comm_recv, METH_VARARGS | METH_KEYWORDS,
     "recv(buf, peer, tag=0, dtype=-1, nonblocking=False)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Comm_getset[] = {
    {"rank", (getter)Comm_get_rank, NULL, "rank in this communicator", NULL},
    {"size", (getter)Comm_get_size, NULL, "number of ranks", NULL},
    {"local_rank", (getter)Comm_get_local_rank, NULL, "rank among those on this host", NULL},
    {"local_size", (getter)Comm_get_local_size, NULL, "ranks on this host", NULL},
    {"node_rank", (getter)Comm_get_node_rank, NULL, "index of this host", NULL},
    {"node_count", (getter)Comm_get_node_count, NULL, "number of hosts", NULL},
    {"closed", (getter)Comm_get_closed, NULL, "True after close()", NULL},
    {"epoch", (getter)Comm_get_epoch, NULL, "elastic epoch (0 when not elastic)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loom._loom.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Comm() from the environment (LOOM_*, torchrun, Slurm, MPI launchers), or\n"
              "Comm(rank=, size=, store=, timeout=) explicitly.",
    .tp_methods = Comm_methods,
    .tp_getset = Comm_getset,
    .tp_new = Comm_new,
};

/* ---- Request -------------------------------------------------------------- */

static void request_finish(RequestObject *r, loom_status_t st)
{
    r->finished = 1;
    r->status = (int)st;
    r->req = NULL;
    lbuf_release(&r->a);
    lbuf_release(&r->b);
    PyMem_Free(r->counts[0]);
    PyMem_Free(r->counts[1]);
    r->counts[0] = r->counts[1] = NULL;
    r->comm->pending--;
}

static PyObject *request_result(RequestObject *r)
{
    if (r->status != LOOM_SUCCESS)
        return raise_status(r->comm->comm, (loom_status_t)r->status, "wait");
    Py_RETURN_NONE;
}

/* Finish r without the GIL. Only one thread may call loom_wait on a request
 * (it frees it): a second waiter polls until the first is done. */
static void request_wait_nogil(RequestObject *r)
{
    while (!r->finished && r->in_wait) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
    if (r->finished)
        return;
    loom_request_t req = r->req;
    loom_status_t st;
    r->in_wait = 1;
    Py_BEGIN_ALLOW_THREADS
    st = loom_wait(req);
    Py_END_ALLOW_THREADS
    r->in_wait = 0;
    request_finish(r, st);
}

static PyObject *Request_wait(RequestObject *r, PyObject *unused)
{
    (void)unused;
    request_wait_nogil(r);
    return request_result(r);
}

static PyObject *Request_test(RequestObject *r, PyObject *unused)
{
    (void)unused;
    if (!r->finished) {
        if (r->in_wait)
            Py_RETURN_FALSE;
        int done = 0;
        loom_status_t st = loom_test(r->req, &done);
        if (!done)
            Py_RETURN_FALSE;
        request_finish(r, st);
    }
    if (r->status != LOOM_SUCCESS)
        return request_result(r);
    Py_RETURN_TRUE;
}

static PyObject *Request_get_done(RequestObject *r, void *closure)
{
    (void)closure;
    return PyBool_FromLong(r->finished);
}

static void Request_dealloc(RequestObject *r)
{
    /* libloom still writes into the buffers this object keeps alive: finish first. */
    if (!r->finished && r->req)
        request_wait_nogil(r);
    Py_XDECREF(r->comm);
    PyObject_Free(r);
}

static PyMethodDef Request_methods[] = {
    {"wait", (PyCFunction)Request_wait, METH_NOARGS,
     "Block (without the GIL) until done; raise LoomError on failure."},
    {"test", (PyCFunction)Request_test, METH_NOARGS, "True when done (raises if it failed)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Request_getset[] = {
    {"done", (getter)Request_get_done, NULL, "True once wait/test saw it finish", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loom._loom.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-blocking operation; keeps its buffers alive until finished.",
    .tp_methods = Request_methods,
    .tp_getset = Request_getset,
};

/* ---- module --------------------------------------------------------------- */

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(loom_version());
}

static PyObject *mod_dtype_size(PyObject *m, PyObject *args)
{
    (void)m;
    int dt;
    if (!PyArg_ParseTuple(args, "i", &dt))
        return NULL;
    return PyLong_FromSize_t(loom_dtype_size((loom_dtype_t)dt));
}

static PyObject *mod_buffer_info(PyObject *m, PyObject *obj)
{
    /* (address, nbytes, loom dtype or -1): lets tests prove nothing was copied. */
    (void)m;
    lbuf_t b;
    if (lbuf_get(obj, 0, &b, "buffer_info") < 0)
        return NULL;
    PyObject *r = Py_BuildValue("(KKi)", (unsigned long long)(uintptr_t)b.ptr,
                                (unsigned long long)b.nbytes, b.dtype);
    lbuf_release(&b);
    return r;
}

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS, "libloom's version string."},
    {"dtype_size", mod_dtype_size, METH_VARARGS, "Bytes per element of a loom dtype."},
    {"buffer_info", mod_buffer_info, METH_O,
     "(address, nbytes, dtype) of the memory loom would use for obj."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_loom",
                                       "CPython binding of libloom.", -1, module_methods,
                                       NULL, NULL, NULL, NULL};

/* Whether the libloom linked here was built with CUDA: it then exports the
 * stream-ordered calls of loom_cuda.h (python/setup.py's libloom_has_cuda asks
 * the same of the library it links). Looked up in that very library, found
 * through one of its symbols, not in whatever the process loaded first. */
static int libloom_has_cuda(void)
{
    Dl_info info;
    if (!dladdr((void *)loom_version, &info) || !info.dli_fname)
        return 0;
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        return 0;
    int has = dlsym(lib, "loom_comm_set_device") != NULL;
    dlclose(lib);
    return has;
}

PyMODINIT_FUNC PyInit__loom(void)
{
    if (PyType_Ready(&CommType) < 0 || PyType_Ready(&RequestType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    LoomError = PyErr_NewExceptionWithDoc("loom.LoomError",
                                          "A libloom call failed; .status holds the loom_status_t.",
                                          PyExc_RuntimeError, NULL);
    if (!LoomError || PyModule_AddObject(m, "LoomError", LoomError) < 0)
        goto fail;
    Py_INCREF(LoomError);
    LoomInternalError = PyErr_NewExceptionWithDoc(
        "loom.LoomInternalError",
        "A collective failed because the job lost a rank or its network (peer lost, revoked\n"
        "epoch, transport error, timeout): what an elastic job recovers from.\n"
        "Horovod's HorovodInternalError.", LoomError, NULL);
    if (!LoomInternalError || PyModule_AddObject(m, "LoomInternalError", LoomInternalError) < 0)
        goto fail;
    Py_INCREF(LoomInternalError);
    Py_INCREF(&CommType);
    if (PyModule_AddObject(m, "Comm", (PyObject *)&CommType) < 0)
        goto fail;
    Py_INCREF(&RequestType);
    if (PyModule_AddObject(m, "Request", (PyObject *)&RequestType) < 0)
        goto fail;
    static const struct { const char *name; int value; } consts[] = {
        {"INT8", LOOM_INT8}, {"UINT8", LOOM_UINT8}, {"INT16", LOOM_INT16},
        {"UINT16", LOOM_UINT16}, {"INT32", LOOM_INT32},
        {"UINT32", LOOM_UINT32}, {"INT64", LOOM_INT64}, {"UINT64", LOOM_UINT64},
        {"FLOAT16", LOOM_FLOAT16}, {"BFLOAT16", LOOM_BFLOAT16}, {"FLOAT32", LOOM_FLOAT32},
        {"FLOAT64", LOOM_FLOAT64}, {"SUM", LOOM_SUM}, {"PROD", LOOM_PROD}, {"MIN", LOOM_MIN},
        {"MAX", LOOM_MAX}, {"AVG", LOOM_AVG}, {"BAND", LOOM_BAND}, {"BOR", LOOM_BOR},
        {"BXOR", LOOM_BXOR},
        {"ERR_INVALID_ARG", LOOM_ERR_INVALID_ARG}, {"ERR_NO_MEMORY", LOOM_ERR_NO_MEMORY},
        {"ERR_TIMEOUT", LOOM_ERR_TIMEOUT}, {"ERR_PEER_LOST", LOOM_ERR_PEER_LOST},
        {"ERR_TRANSPORT", LOOM_ERR_TRANSPORT}, {"ERR_MISMATCH", LOOM_ERR_MISMATCH},
        {"ERR_UNSUPPORTED", LOOM_ERR_UNSUPPORTED}, {"ERR_AUTH", LOOM_ERR_AUTH},
        {"ERR_ABORTED", LOOM_ERR_ABORTED}, {"ERR_INTERNAL", LOOM_ERR_INTERNAL},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
            goto fail;
    cuda_built = libloom_has_cuda();
    if (PyModule_AddIntConstant(m, "CUDA_BUILT", cuda_built) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
