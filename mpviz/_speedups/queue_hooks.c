/* queue_hooks.c -- trace/messages.py's per-message Queue hooks in C, and a get or put that waits.

Part of writer.c's module, not a module of its own: writer.c includes this file (#include
"queue_hooks.c", after the Writer), so everything here uses the Writer's functions and names
directly -- write_queue_event, write_event, current_writer, put_value, begin_record and
end_record, the interned strs -- and writer.c's module table lists the functions defined here.
Read writer.c first (up to "the Writer"), then this.

So that recording a message runs no Python function of ours: ``Tap`` (a Queue's pipe read and
its feeder's write, each with its event), and ``Tag``, ``Pickler`` and ``Hook`` (put, the
feeder's pickling, get); a get with nothing to read yet, or a put into a full bounded queue, is
a recorded wait (``record_get_wait``; waits.py). messages.py's Python versions are the reference.
*/

/* --- Tap: a Queue's pipe read or write, recorded (messages.py's read_bytes / fed_send_bytes) ---

   The same two hooks as the Python closures in messages.py, which are the reference: they run
   once per message, in the threads that move it, so they cost what a C call costs.

       Tap(call, kind, queue, feeding, skip, conn=None)(*args):
         a write, `feeding` given (wraps the feeder's _send_bytes): append `kind` {queue,
              msg, nbytes, sig} for buf -- msg: what Pickler.dumps just pickled in this thread
              (take_feeding_msg), else feeding.msg (and feeding.msg = None) -- then write buf:
              to conn's pipe ourselves (below), else call(buf)
         a read, `feeding` None (wraps the reader's _recv_bytes): res = one message read from
              conn's pipe ourselves (below), else call(); then, unless `skip` is in res's first
              64 bytes (an envelope, recorded as it unpickles), append `kind` {queue, nbytes, sig}
       sig = adler32 of the last 32 bytes (recorder.sig); events go to the Writer recording
       at the time of the call (current_writer; none: nothing appended). The message always
       goes through: an event that cannot be recorded is reported (sys.unraisablehook), never
       raised in its place -- but for a Ctrl-C (writer.c, above report_error).

   `conn` (optional): the queue's pipe end that `call` reads or writes through, when `call` is
   exactly that Connection's recv_bytes/send_bytes (or mpviz's _pipe.read_message of its fd). Then
   the Tap moves the bytes itself, with read(2)/write(2) and the same framing (a 4-byte
   big-endian length, or -1 and an 8-byte one), instead of calling back into Python: the
   stdlib's Connection reads through a BytesIO in a Python loop, and a Python function called
   from C starts a new interpreter loop — together most of what recording a message cost. */


typedef struct {
    PyObject_HEAD
    PyObject *call, *kind, *queue;
    PyObject *feeding;       /* a feed's threading.local with .msg; None for a read */
    PyObject *skip;          /* a read's envelope mark (bytes); None for a feed */
    PyObject *conn;          /* the Connection whose pipe we read or write ourselves, or None */
    vectorcallfunc vectorcall;   /* Tap_call: called without building an args tuple */
} Tap;

/* The pipe's fd, from conn._handle each time (a closed Connection has None there: then -1, and
   the Tap calls `call`, which raises as the stdlib does). */
static int
tap_fd(Tap *t)
{
    if (t->conn == NULL || t->conn == Py_None)
        return -1;
    PyObject *h = PyObject_GetAttr(t->conn, HANDLE);
    if (h == NULL) {
        PyErr_Clear();
        return -1;
    }
    long fd = PyLong_Check(h) ? PyLong_AsLong(h) : -1;
    Py_DECREF(h);
    if (fd < 0 || fd > INT32_MAX) {
        PyErr_Clear();
        return -1;
    }
    return (int)fd;
}

/* Read exactly n bytes, the GIL released while the pipe is empty. As Connection._recv: end of
   file before any of them is EOFError, in the middle OSError. 0: done; -1: an error is set. */
static int
read_exactly(int fd, char *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k;
        Py_BEGIN_ALLOW_THREADS
        k = read(fd, p + got, n - got);
        Py_END_ALLOW_THREADS
        if (k > 0)
            got += (size_t)k;
        else if (k == 0) {
            if (got == 0)
                PyErr_SetNone(PyExc_EOFError);
            else
                PyErr_SetString(PyExc_OSError, "got end of file during message");
            return -1;
        }
        else if (errno != EINTR || PyErr_CheckSignals() < 0) {
            if (!PyErr_Occurred())
                PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
    }
    return 0;
}

static int
write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k;
        Py_BEGIN_ALLOW_THREADS
        k = write(fd, p, n);
        Py_END_ALLOW_THREADS
        if (k >= 0) {
            p += k;
            n -= (size_t)k;
        }
        else if (errno != EINTR || PyErr_CheckSignals() < 0) {
            if (!PyErr_Occurred())
                PyErr_SetFromErrno(PyExc_OSError);   /* BrokenPipeError for EPIPE, as stdlib */
            return -1;
        }
    }
    return 0;
}

/* One framed message: what Connection.recv_bytes() returns. read_message and write_message are
   the C copy, for speed, of mpviz/multiprocessing/_pipe.py's (the reference: read it there). */
static PyObject *
read_message(int fd)
{
    unsigned char head[8];
    if (read_exactly(fd, (char *)head, 4) < 0)
        return NULL;
    int64_t size = (int32_t)((uint32_t)head[0] << 24 | (uint32_t)head[1] << 16
                             | (uint32_t)head[2] << 8 | head[3]);
    if (size == -1) {
        if (read_exactly(fd, (char *)head, 8) < 0)
            return NULL;
        uint64_t big = 0;
        for (int i = 0; i < 8; i++)
            big = big << 8 | head[i];
        if (big > (uint64_t)PY_SSIZE_T_MAX) {
            PyErr_SetString(PyExc_OSError, "message length does not fit in memory");
            return NULL;
        }
        size = (int64_t)big;
    }
    else if (size < 0) {
        PyErr_Format(PyExc_OSError, "bad message length %lld", (long long)size);
        return NULL;
    }
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (res != NULL && size > 0 && read_exactly(fd, PyBytes_AS_STRING(res), (size_t)size) < 0)
        Py_CLEAR(res);
    return res;
}

/* What Connection.send_bytes(data) writes: the length, then the bytes; in one write up to 16 KiB
   (as the stdlib), so a small message never reaches the pipe in two pieces. */
static int
write_message(int fd, const Py_buffer *data)
{
    size_t n = (size_t)data->len;
    unsigned char head[12];
    size_t h = 4;
    if (n <= 0x7fffffff) {
        for (int i = 0; i < 4; i++)
            head[i] = (unsigned char)(n >> (24 - 8 * i));
    }
    else {
        memset(head, 0xff, 4);                              /* -1: an 8-byte length follows */
        for (int i = 0; i < 8; i++)
            head[4 + i] = (unsigned char)((uint64_t)n >> (56 - 8 * i));
        h = 12;
    }
    if (n > 16384)
        return write_all(fd, (const char *)head, h) < 0 ? -1
               : write_all(fd, (const char *)data->buf, n);
    char small[12 + 16384];
    memcpy(small, head, h);
    memcpy(small + h, data->buf, n);
    return write_all(fd, small, h + n);
}

/* The id Pickler.dumps just pickled in this thread (a feeder), until the Tap on its write takes
   it; NULL: none (then the Tap reads feeding.msg, which messages._TagPickler sets). A C
   thread-local: a threading.local costs two lookups a message. */
static __thread PyObject *feeding_msg;

static PyObject *
take_feeding_msg(void)                     /* a new reference, or NULL: none */
{
    PyObject *msg = feeding_msg;
    feeding_msg = NULL;
    return msg;
}

/* How many handles that message carries (messages._CountingPickler counts them as it pickles,
   and sets this after every dumps), until the Tap on its write takes it into its queue.feed. */
static __thread long feeding_handles;

/* {queue, [msg,] nbytes, sig[, handles]} for the bytes in `data`, appended at ts by the Writer
   recording (handles: only when > 0, as messages.carried). */
static int
tap_emit(Tap *t, uint64_t ts, PyObject *msg, const Py_buffer *data, long handles)
{
    PyObject *w = recording_writer(), *res = NULL;
    if (w == Py_None)                                       /* not recording */
        res = Py_NewRef(Py_None);
    else if (Py_IS_TYPE(w, &WriterType))                    /* the usual case: no dict */
        res = write_queue_event((Writer *)w, ts, t->kind, t->queue, msg, data, handles);
    else {                                                  /* the Python Writer */
        Py_ssize_t n = data->len, k = n < 32 ? n : 32;
        uint32_t sig = adler32((const unsigned char *)data->buf + (n - k), (size_t)k);
        PyObject *args = PyDict_New(), *nbytes = PyLong_FromSsize_t(n);
        PyObject *check = PyLong_FromUnsignedLong(sig), *when = PyLong_FromUnsignedLongLong(ts);
        PyObject *carried = handles > 0 ? PyLong_FromLong(handles) : NULL;
        if (args != NULL && nbytes != NULL && check != NULL && when != NULL
                && (handles <= 0 || carried != NULL)
                && PyDict_SetItem(args, QUEUE, t->queue) == 0
                && (msg == NULL || PyDict_SetItem(args, MSG, msg) == 0)
                && PyDict_SetItem(args, NBYTES, nbytes) == 0
                && PyDict_SetItem(args, SIG, check) == 0
                && (carried == NULL || PyDict_SetItem(args, HANDLES, carried) == 0))
            res = PyObject_CallMethodObjArgs(w, EMIT_AT, when, t->kind, args, NULL);
        Py_XDECREF(args);
        Py_XDECREF(nbytes);
        Py_XDECREF(check);
        Py_XDECREF(when);
        Py_XDECREF(carried);
    }
    Py_DECREF(w);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

/* The queue id of the get's wait this thread is in (record_get_wait, below), until a queue.get
   on that queue is recorded in this thread: that event ends the wait (waits.py, top). NULL: none.
   A borrowed reference: record_get_wait's caller holds the id until the wait is over. */
static __thread PyObject *open_get_wait;

/* A queue.get on `qid` was just recorded in this thread: if it is the queue of the get's wait
   this thread is in, that event has ended the wait. 0, or -1 with an error set. */
static int
end_get_wait(PyObject *qid)
{
    if (open_get_wait == NULL)
        return 0;
    int same = qid == open_get_wait ? 1 : PyObject_RichCompareBool(qid, open_get_wait, Py_EQ);
    if (same > 0)
        open_get_wait = NULL;
    return same < 0 ? -1 : 0;
}

static PyObject *
Tap_call(Tap *t, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_buffer data;
    if (t->call == NULL) {
        PyErr_SetString(PyExc_TypeError, "Tap.__init__() was not called");
        return NULL;
    }
    if (t->feeding != Py_None) {                            /* a feed: the event first */
        if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL
                && PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) == 0) {
            PyObject *msg = take_feeding_msg();             /* from Pickler.dumps */
            long handles = feeding_handles;                 /* (and _CountingPickler) */
            feeding_handles = 0;
            int r = 0;
            if (msg == NULL) {                              /* from messages._TagPickler */
                msg = PyObject_GetAttr(t->feeding, MSG);
                if (msg == NULL) {                          /* nothing pickled with an id */
                    PyErr_Clear();
                    msg = Py_NewRef(Py_None);
                }
                r = PyObject_SetAttr(t->feeding, MSG, Py_None);
            }
            if (r == 0)
                r = tap_emit(t, now_ns(), msg, &data, handles);
            Py_DECREF(msg);
            if (r < 0) {                    /* not recorded; written all the same ... */
                if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                    PyBuffer_Release(&data);
                    return NULL;            /* ... unless it is a Ctrl-C: see report_error */
                }
                PyErr_WriteUnraisable(t->kind);
            }
            int fd = tap_fd(t);
            if (fd >= 0) {
                r = write_message(fd, &data);   /* the write ourselves: see Tap above */
                PyBuffer_Release(&data);
                return r < 0 ? NULL : Py_NewRef(Py_None);
            }
            PyBuffer_Release(&data);
        }
        else
            PyErr_Clear();                  /* not bytes-like: written, but not recorded */
        return PyObject_Vectorcall(t->call, args, nargsf, kwnames);
    }
    PyObject *res;                                              /* a read */
    int fd = PyVectorcall_NARGS(nargsf) == 0 && kwnames == NULL ? tap_fd(t) : -1;
    if (fd >= 0)
        res = read_message(fd);             /* the read ourselves: see Tap above */
    else
        res = PyObject_Vectorcall(t->call, args, nargsf, kwnames);
    if (res == NULL)
        return NULL;
    if (PyObject_GetBuffer(res, &data, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();                      /* not bytes-like: read, but not recorded */
        return res;
    }
    int r = 0;
    const char *mark = PyBytes_Check(t->skip) ? PyBytes_AS_STRING(t->skip) : NULL;
    if (mark == NULL || memmem(data.buf, data.len < 64 ? (size_t)data.len : 64, mark,
                               (size_t)PyBytes_GET_SIZE(t->skip)) == NULL) {
        r = tap_emit(t, now_ns(), NULL, &data, 0);
        if (r == 0 && open_get_wait != NULL)        /* recorded: it ends this get's wait */
            r = end_get_wait(t->queue);
    }
    PyBuffer_Release(&data);
    if (r < 0) {                            /* not recorded; the message is the caller's anyway */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_DECREF(res);                 /* a Ctrl-C: up, as from the Python reference */
            return NULL;
        }
        PyErr_WriteUnraisable(t->kind);
    }
    return res;
}

static int
Tap_init(Tap *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"call", "kind", "queue", "feeding", "skip", "conn", NULL};
    PyObject *v[6] = {NULL, NULL, NULL, NULL, NULL, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOOO|O:Tap", names, &v[0], &v[1], &v[2],
                                     &v[3], &v[4], &v[5]))
        return -1;
    Py_XSETREF(t->conn, Py_NewRef(v[5]));
    Py_XSETREF(t->call, Py_NewRef(v[0]));
    Py_XSETREF(t->kind, Py_NewRef(v[1]));
    Py_XSETREF(t->queue, Py_NewRef(v[2]));
    Py_XSETREF(t->feeding, Py_NewRef(v[3]));
    Py_XSETREF(t->skip, Py_NewRef(v[4]));
    t->vectorcall = (vectorcallfunc)Tap_call;
    return 0;
}

static int
Tap_traverse(Tap *t, visitproc visit, void *arg)
{
    Py_VISIT(t->call);
    Py_VISIT(t->kind);
    Py_VISIT(t->queue);
    Py_VISIT(t->feeding);
    Py_VISIT(t->skip);
    Py_VISIT(t->conn);
    return 0;
}

static int
Tap_clear(Tap *t)
{
    Py_CLEAR(t->call);
    Py_CLEAR(t->kind);
    Py_CLEAR(t->queue);
    Py_CLEAR(t->feeding);
    Py_CLEAR(t->skip);
    Py_CLEAR(t->conn);
    return 0;
}

static void
Tap_dealloc(Tap *t)
{
    PyObject_GC_UnTrack(t);
    Tap_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* messages.py knows its hooks by this mark (``_hooked``), on the Python closures too. */
static PyObject *Tap_get_mark(Tap *t, void *closure) { Py_RETURN_TRUE; }

static PyGetSetDef Tap_getset[] = {
    {"_mpviz", (getter)Tap_get_mark, NULL, "always True: this is mpviz's hook", NULL},
    {NULL}
};

static PyTypeObject TapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpviz._speedups._writer.Tap",
    .tp_doc = "Tap(call, kind, queue, feeding, skip, conn=None): a Queue's read or write, "
              "recorded",
    .tp_basicsize = sizeof(Tap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tap_init,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Tap, vectorcall),
    .tp_dealloc = (destructor)Tap_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Tap_traverse,
    .tp_clear = (inquiry)Tap_clear,
    .tp_getset = Tap_getset,
};

/* --- Tag, Pickler, Hook: a Queue's put and get, recorded (messages.py's put, _TagPickler and
   _queue_get) -------------------------------------------------------------------------------

   Tap records the two hooks that see a message's bytes. These three do the rest of what
   recording a stdlib Queue's message takes, so that no Python function runs per message:

       q.put(obj)     Hook("put", ...): append queue.put {queue, msg}, then call the stdlib's
                      put with Tag(obj, msg) in obj's place (or an envelope: for_feeder); should
                      that raise, messages.put_failed records queue.put_failed
       feeder thread  Pickler.dumps(Tag): pickle obj alone, and leave msg for the Tap that
                      wraps the write, in a C thread-local (messages._TagPickler.dumps, which
                      this replaces, leaves it in the threading.local feeding.msg)
       q.get()        Hook("get", ...): wrap q's read in a Tap, if not done yet (the Python
                      _queue_get does that), then call the stdlib's get

   Each does exactly what its Python reference in messages.py does, which it calls itself for
   the cases it leaves out: recording with the Python Writer, `obj` passed by keyword, a queue
   not seen before (its id, its first read), an envelope. Message ids come from messages.py's own
   counter (``_prefix + str(next(_counter))``; messages.py hands us each new one), so the two
   never hand out the same id. */

static PyObject *QID, *THREAD, *HOOKED_FEEDER, *RECV_BYTES, *OBJ;      /* interned strs */

/* Tag(obj, msg): a put's object and its id, in a Queue's buffer (messages._Tag). */
typedef struct {
    PyObject_HEAD
    PyObject *obj, *msg;
} Tag;

static PyTypeObject TagType;

static PyObject *
new_tag(PyObject *obj, PyObject *msg)
{
    Tag *t = PyObject_GC_New(Tag, &TagType);
    if (t == NULL)
        return NULL;
    t->obj = Py_NewRef(obj);
    t->msg = Py_NewRef(msg);
    PyObject_GC_Track(t);
    return (PyObject *)t;
}

static PyObject *
Tag_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *obj, *msg;
    static char *names[] = {"obj", "msg", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Tag", names, &obj, &msg))
        return NULL;
    return new_tag(obj, msg);
}

/* Should a tag outlive recording, the plain ForkingPickler pickles it as the object. */
static PyObject *
Tag_reduce(Tag *t, PyObject *unused)
{
    PyObject *identity = NULL, *m = PyImport_ImportModule("mpviz.trace.messages");
    if (m != NULL) {
        identity = PyObject_GetAttrString(m, "_identity");
        Py_DECREF(m);
    }
    if (identity == NULL)
        return NULL;
    return Py_BuildValue("N(O)", identity, t->obj);
}

static int
Tag_traverse(Tag *t, visitproc visit, void *arg)
{
    Py_VISIT(t->obj);
    Py_VISIT(t->msg);
    return 0;
}

static int
Tag_clear(Tag *t)
{
    Py_CLEAR(t->obj);
    Py_CLEAR(t->msg);
    return 0;
}

static void
Tag_dealloc(Tag *t)
{
    PyObject_GC_UnTrack(t);
    Tag_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMemberDef Tag_members[] = {
    {"obj", T_OBJECT_EX, offsetof(Tag, obj), READONLY, "the object put"},
    {"msg", T_OBJECT_EX, offsetof(Tag, msg), READONLY, "its message id"},
    {NULL}
};

static PyMethodDef Tag_methods[] = {
    {"__reduce__", (PyCFunction)Tag_reduce, METH_NOARGS, "pickled as the object alone"},
    {NULL}
};

static PyTypeObject TagType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpviz._speedups._writer.Tag",
    .tp_doc = "Tag(obj, msg): a put's object and its message id (messages._Tag in C)",
    .tp_basicsize = sizeof(Tag),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Tag_new,
    .tp_dealloc = (destructor)Tag_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Tag_traverse,
    .tp_clear = (inquiry)Tag_clear,
    .tp_members = Tag_members,
    .tp_methods = Tag_methods,
};

/* Pickler(pickler, py_tag): stands in for multiprocessing.queues._ForkingPickler
   (`pickler`, the ForkingPickler class) while recording. The feeder calls its dumps; get calls
   its loads, which is the ForkingPickler's own, as is anything else (found through an
   AttributeError: too slow for once per message, so loads is kept here). */
typedef struct {
    PyObject_HEAD
    PyObject *pickler, *dumps, *loads, *py_tag;
} Pickler;

static PyObject *
Pickler_dumps(Pickler *p, PyObject *const *argv, Py_ssize_t argc, PyObject *kwnames)
{
    if (p->dumps == NULL) {
        PyErr_SetString(PyExc_TypeError, "Pickler.__init__() was not called");
        return NULL;
    }
    PyObject *protocol = argc == 2 ? argv[1] : Py_None;
    if (kwnames != NULL && argc == 1 && PyTuple_GET_SIZE(kwnames) == 1
            && PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))
            && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "protocol") == 0)
        protocol = argv[1];                          /* dumps(obj, protocol=...) */
    else if (argc < 1 || argc > 2 || kwnames != NULL)  /* not dumps(obj[, protocol]) */
        return PyObject_Vectorcall(p->dumps, argv, argc, kwnames);
    PyObject *obj = argv[0], *msg = Py_None, *owned_obj = NULL, *owned_msg = NULL;
    if (Py_IS_TYPE(obj, &TagType)) {
        msg = ((Tag *)obj)->msg;
        obj = ((Tag *)obj)->obj;
    }
    else if ((PyObject *)Py_TYPE(obj) == p->py_tag) {   /* a Python _Tag (mpviz's Queue) */
        owned_msg = PyObject_GetAttr(obj, MSG);
        owned_obj = PyObject_GetAttr(obj, OBJ);
        if (owned_msg == NULL || owned_obj == NULL) {
            Py_XDECREF(owned_msg);
            Py_XDECREF(owned_obj);
            return NULL;
        }
        msg = owned_msg;
        obj = owned_obj;
    }
    PyObject *stack[2] = {obj, protocol};
    PyObject *data = PyObject_Vectorcall(p->dumps, stack, 2, NULL);
    /* once pickled: a failed dump writes nothing, and leaves no id waiting */
    if (data != NULL)
        Py_XSETREF(feeding_msg, Py_NewRef(msg));
    Py_XDECREF(owned_msg);
    Py_XDECREF(owned_obj);
    return data;
}

static PyObject *
Pickler_getattro(Pickler *p, PyObject *name)
{
    PyObject *v = PyObject_GenericGetAttr((PyObject *)p, name);
    if (v != NULL || p->pickler == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return v;
    PyErr_Clear();
    return PyObject_GetAttr(p->pickler, name);      /* loads, register, ...: ForkingPickler's */
}

static int
Pickler_init(Pickler *p, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"pickler", "py_tag", NULL};
    PyObject *pickler, *py_tag;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Pickler", names, &pickler, &py_tag))
        return -1;
    PyObject *dumps = PyObject_GetAttrString(pickler, "dumps");
    PyObject *loads = dumps ? PyObject_GetAttrString(pickler, "loads") : NULL;
    if (loads == NULL) {
        Py_XDECREF(dumps);
        return -1;
    }
    Py_XSETREF(p->dumps, dumps);
    Py_XSETREF(p->loads, loads);
    Py_XSETREF(p->pickler, Py_NewRef(pickler));
    Py_XSETREF(p->py_tag, Py_NewRef(py_tag));
    return 0;
}

static int
Pickler_traverse(Pickler *p, visitproc visit, void *arg)
{
    Py_VISIT(p->pickler);
    Py_VISIT(p->dumps);
    Py_VISIT(p->loads);
    Py_VISIT(p->py_tag);
    return 0;
}

static int
Pickler_clear(Pickler *p)
{
    Py_CLEAR(p->pickler);
    Py_CLEAR(p->dumps);
    Py_CLEAR(p->loads);
    Py_CLEAR(p->py_tag);
    return 0;
}

static void
Pickler_dealloc(Pickler *p)
{
    PyObject_GC_UnTrack(p);
    Pickler_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef Pickler_methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))Pickler_dumps, METH_FASTCALL | METH_KEYWORDS,
     "dumps(obj, protocol=None): ForkingPickler.dumps of obj, or of a Tag's object alone"},
    {NULL}
};

static PyMemberDef Pickler_members[] = {
    {"loads", T_OBJECT_EX, offsetof(Pickler, loads), READONLY, "ForkingPickler.loads"},
    {NULL}
};

static PyTypeObject PicklerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpviz._speedups._writer.Pickler",
    .tp_doc = "Pickler(pickler, py_tag): the feeder's pickler while recording "
              "(messages._TagPickler in C)",
    .tp_basicsize = sizeof(Pickler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pickler_init,
    .tp_getattro = (getattrofunc)Pickler_getattro,
    .tp_dealloc = (destructor)Pickler_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Pickler_traverse,
    .tp_clear = (inquiry)Pickler_clear,
    .tp_methods = Pickler_methods,
    .tp_members = Pickler_members,
};

/* Hook(kind, call, slow, messages): a Queue method while recording, installed on the
   class; `call` is the stdlib's method, `slow` the Python hook of messages.py. Called like a
   method (a method descriptor: q.put(x) calls it with q first, as a function would be). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int is_put;                  /* 1: put, 0: get */
    PyObject *call, *slow;
    PyObject *queue_id, *for_feeder, *put_failed;    /* messages.py's, for what we leave out */
} Hook;

/* obj.name, or NULL with no error where obj has no such attribute (a new reference). Not
   through obj.__dict__: reading a queue's __dict__ makes Python 3.11+ build it, and from then
   on every attribute of that queue is read the slow way, in the stdlib's code too. */
#if PY_VERSION_HEX >= 0x030D0000
#define optional_attr PyObject_GetOptionalAttr
#else
#define optional_attr _PyObject_LookupAttr
#endif

/* What a recorded put hands to the stdlib's put in obj's place (messages.for_feeder): a Tag when
   the queue's feeder thread writes through our Tap (or has not started); else the envelope
   for_feeder makes. */
static PyObject *
item_for_feeder(Hook *h, PyObject *q, PyObject *obj, PyObject *qid, PyObject *msg)
{
    PyObject *thread = NULL, *hooked = NULL, *item = NULL;
    if (optional_attr(q, THREAD, &thread) < 0)
        return NULL;
    if (thread != NULL && thread != Py_None && optional_attr(q, HOOKED_FEEDER, &hooked) < 0) {
        Py_DECREF(thread);
        return NULL;
    }
    if (thread == Py_None || (hooked != NULL && hooked == thread))
        item = new_tag(obj, msg);
    else
        item = PyObject_CallFunctionObjArgs(h->for_feeder, q, obj, qid, msg, NULL);
    Py_XDECREF(thread);
    Py_XDECREF(hooked);
    return item;
}

/* messages.py's _counter and _prefix as it last set them (set_numbering: at import and in a
   forked child); NULL until then, and the hooks read them from messages.py. */
static PyObject *msg_counter, *msg_prefix;

static PyObject *
set_numbering_function(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "set_numbering(counter, prefix) takes 2 arguments");
        return NULL;
    }
    Py_XSETREF(msg_counter, Py_NewRef(argv[0]));
    Py_XSETREF(msg_prefix, Py_NewRef(argv[1]));
    Py_RETURN_NONE;
}

/* messages.next_msg(): _prefix + str(next(_counter)), from messages.py's own counter. */
static PyObject *
next_msg(void)
{
    PyObject *counter = msg_counter, *prefix = msg_prefix;
    if (counter == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpviz.trace.messages has not handed its message "
                        "counter over (messages.install_native calls set_numbering)");
        return NULL;
    }
    Py_INCREF(counter);                  /* ours while next() and str() run */
    Py_INCREF(prefix);
    PyObject *n = PyIter_Next(counter), *text = n ? PyObject_Str(n) : NULL, *msg = NULL;
    if (text != NULL)
        msg = PyUnicode_Concat(prefix, text);
    else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "mpviz: the message counter ended");
    Py_XDECREF(n);
    Py_XDECREF(text);
    Py_DECREF(counter);
    Py_DECREF(prefix);
    return msg;
}

static PyObject *PUT_KIND;      /* "queue.put" */

/* messages._tagging_put's put, with the C Writer recording and obj passed by position. */
static PyObject *
hook_put(Hook *h, Writer *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);      /* 2 to 4, no keywords: see below */
    PyObject *stack[4], *q = args[0], *qid = NULL, *msg = NULL, *item = NULL, *res = NULL;
    int recorded = 0;
    if (optional_attr(q, QID, &qid) < 0)                        /* messages._queue_id(q) */
        return NULL;
    if (qid == NULL)
        qid = PyObject_CallOneArg(h->queue_id, q);
    if (qid != NULL)
        msg = next_msg();
    if (msg != NULL) {
        /* the event; an error here is one on_error raised: the caller gets it, as in Python */
        PyObject *r = write_queue_event(w, now_ns(), PUT_KIND, qid, msg, NULL, 0);
        if (r != NULL) {
            Py_DECREF(r);
            recorded = 1;
            item = item_for_feeder(h, q, args[1], qid, msg);
        }
    }
    if (item != NULL) {
        memcpy(stack, args, (size_t)nargs * sizeof(PyObject *));
        stack[1] = item;
        res = PyObject_Vectorcall(h->call, stack, nargs, kwnames);
    }
    if (res == NULL && recorded && PyErr_Occurred()) {
        /* recorded, but never entered the queue (Full, closed): messages.put_failed says so,
           and the caller gets the stdlib's exception */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *r = PyObject_CallFunctionObjArgs(h->put_failed, qid, msg,
                                                   value ? value : Py_None, NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(h->put_failed);
        Py_XDECREF(r);
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(qid);
    Py_XDECREF(msg);
    Py_XDECREF(item);
    return res;
}

/* Whether a read of fd would return at once (bytes, or end of file): poll(2) with timeout 0.
   1: yes, 0: no (it would block), -1: poll failed (then we cannot tell). */
static int
fd_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : n > 0;
}

static int read_lock_held(PyObject *q);

/* The `block` argument of get(q, block, timeout) or put(q, obj, block, timeout), given by
   position at `i` (absent: True). 1, 0, or -1 with an error set. */
static int
blocks(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t i)
{
    return nargs > i ? PyObject_IsTrue(args[i]) : 1;
}

static PyObject *waited_get(Hook *h, Writer *w, PyObject *const *args, size_t nargsf);
static int inside_wait(void);

/* messages._queue_get: the stdlib's get, its read wrapped in a Tap first. A queue whose read is
   a Tap already needs nothing more (the Tap itself sees whether we record) -- unless, while
   recording, a blocking get finds nothing to read yet: then the Python hook records it as a
   wait (messages.get_would_wait asks again). Any other queue goes to the Python hook while
   recording, which wraps it, and straight to the stdlib's get if not. */
static PyObject *
hook_get(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *read = NULL;
    if (optional_attr(args[0], RECV_BYTES, &read) < 0)
        return NULL;
    int tapped = read != NULL && Py_IS_TYPE(read, &TapType);
    int recording = current_writer != NULL;    /* (recorder.ENABLED) */
    if (tapped && recording) {
        /* the usual get finds a message at once: one poll(2), and on to the stdlib's get */
        int fd = kwnames == NULL ? tap_fd((Tap *)read) : -1;
        int block = blocks(args, PyVectorcall_NARGS(nargsf), 1);
        if (block < 0) {
            Py_DECREF(read);
            return NULL;
        }
        int inside = 0;
        if (block && (fd < 0 || fd_readable(fd) == 0              /* it will wait ... */
                      || read_lock_held(args[0]))      /* (for the read lock, if not data) */
                && (inside = inside_wait()) == 0) {     /* ... and not inside another wait */
            Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
            PyObject *w = current_writer;
            Py_DECREF(read);
            if (Py_IS_TYPE(w, &WriterType) && fd >= 0 && (nargs < 3 || args[2] == Py_None))
                return waited_get(h, (Writer *)w, args, nargsf);   /* get() or get(True) */
            return PyObject_Vectorcall(h->slow, args, nargsf, kwnames);   /* a timeout */
        }
        if (inside < 0) {
            Py_DECREF(read);
            return NULL;
        }
    }
    Py_XDECREF(read);
    if (tapped)
        return PyObject_Vectorcall(h->call, args, nargsf, kwnames);
    return PyObject_Vectorcall(recording ? h->slow : h->call, args, nargsf, kwnames);
}

static PyObject *MAXSIZE, *SEM, *SEMLOCK, *IS_ZERO, *RLOCK;      /* interned strs */

/* Whether another reader holds q's read lock (q._rlock._semlock._is_zero()): a get that finds
   a message there still waits for that lock -- for ever, if its holder was killed inside its
   own get (terminate()). 1 or 0 (0 too for a queue with no such lock). messages.py's
   _read_lock_held is the reference. */
static int
read_lock_held(PyObject *q)
{
    PyObject *lock = NULL;
    if (optional_attr(q, RLOCK, &lock) < 0 || lock == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *semlock = PyObject_GetAttr(lock, SEMLOCK);
    Py_DECREF(lock);
    PyObject *zero = semlock != NULL ? PyObject_CallMethodNoArgs(semlock, IS_ZERO) : NULL;
    Py_XDECREF(semlock);
    if (zero == NULL) {
        PyErr_Clear();
        return 0;
    }
    int r = PyObject_IsTrue(zero);
    Py_DECREF(zero);
    if (r < 0)
        PyErr_Clear();
    return r > 0;
}
static PyObject *WAIT_BEGIN, *WAIT_END, *GET_KIND, *ON, *ID, *OK, *ERROR, *TIMEOUT, *READER;

/* wait.begin {on, id[, timeout]} (ok < 0), or wait.end {on, id, ok[, error]}: the events of
   waits.py's _recorded, written straight into the record (as write_queue_event does: no dict). */
static PyObject *
write_wait_event(Writer *w, PyObject *kind, PyObject *on, PyObject *id, PyObject *timeout,
                 int ok, PyObject *error)
{
    Buf b;
    buf_init(&b);
    int r = begin_record(&b, now_ns(), thread_id(), kind)
            || put_char(&b, '{') || put_value(&b, ON) || put_value(&b, on)
            || put_value(&b, ID) || put_value(&b, id);
    if (r == 0 && timeout != NULL && timeout != Py_None)
        r = put_value(&b, TIMEOUT) || put_value(&b, timeout);
    if (r == 0 && ok >= 0)
        r = put_value(&b, OK) || put_value(&b, ok ? Py_True : Py_False);
    if (r == 0 && error != NULL)
        r = put_value(&b, ERROR) || put_value(&b, error);
    if (r == 0)
        r = put_char(&b, '0') || end_record(&b);
    if (r == 0)
        r = append(w, &b);
    buf_free(&b);
    if (r != 0)
        return report_error(w, kind);
    Py_RETURN_NONE;
}

/* Set while this thread is inside a get recorded as a wait here: mpviz's Queue.get calls itself
   inside its wait (messages.waiting_get), and that inner get must not ask again. */
static __thread int in_get_wait;

/* waits._in_wait (messages.install_native passes it: set_in_wait): its .on, set while a thread
   is inside a wait that waits.py records. A get's wait recorded here sets in_get_wait instead
   (a C thread-local: setting a threading.local twice a get cost as much as the wait.end that
   the queue.get now stands for), and the questions "inside a recorded wait?" ask both: here
   (get_would_wait, hook_get) and in waits.py, whose _outermost is outermost_function below
   while the C Writer records. One rule, whichever records: no wait inside a recorded wait. */
static PyObject *in_wait_local;

/* Whether this thread is inside a recorded wait already (then a new wait is not recorded:
   waits inside waits are recorded once, the outermost). 1, 0, or -1 with an error set. */
static int
inside_wait(void)
{
    if (in_get_wait)
        return 1;
    if (in_wait_local == NULL)
        return 0;
    PyObject *on = NULL;
    if (optional_attr(in_wait_local, ON, &on) < 0)
        return -1;
    int inside = on != NULL && on != Py_None;
    Py_XDECREF(on);
    return inside;
}

/* waits.get_wait with the C Writer: wait.begin, then the get, whose read records the queue.get
   that ends the wait (Tap_call, messages.got: end_get_wait). Should the get end without that
   event -- Empty (a timeout ran out), Ctrl-C, EOFError before the read, a message that came with
   no event -- wait.end {ok: True}, or {ok: False, error} if it raised, as waits.py's _recorded.
   Like _recorded, it marks the thread as inside a wait meanwhile (in_get_wait: see above): a
   wait inside it (a signal handler's Event.wait, p.join(), q.get()) is not recorded. */
static PyObject *
record_get_wait(Writer *w, PyObject *qid, PyObject *timeout, PyObject *call,
                PyObject *const *args, size_t nargsf)
{
    PyObject *r = write_wait_event(w, WAIT_BEGIN, GET_KIND, qid, timeout, -1, NULL);
    if (r == NULL)                          /* on_error raised (a Ctrl-C): as from Python */
        return NULL;
    Py_DECREF(r);
    in_get_wait = 1;
    open_get_wait = qid;
    PyObject *res = PyObject_Vectorcall(call, args, nargsf, NULL);
    in_get_wait = 0;
    int ended = open_get_wait == NULL;      /* by the queue.get of its read */
    open_get_wait = NULL;
    if (ended)
        return res;
    PyObject *now = recording_writer();     /* (recording may have stopped meanwhile) */
    if (Py_IS_TYPE(now, &WriterType)) {
        if (res != NULL) {
            r = write_wait_event((Writer *)now, WAIT_END, GET_KIND, qid, NULL, 1, NULL);
            if (r == NULL)
                Py_CLEAR(res);
        }
        else {                              /* Empty, Ctrl-C, EOFError ...: ok False */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *name = type != NULL ? PyObject_GetAttrString(type, "__name__") : NULL;
            r = name != NULL ? write_wait_event((Writer *)now, WAIT_END, GET_KIND, qid, NULL, 0,
                                                name)
                             : NULL;
            if (r == NULL)
                PyErr_WriteUnraisable(WAIT_END);    /* the get's own exception goes up */
            Py_XDECREF(name);
            PyErr_Restore(type, value, tb);
        }
        Py_XDECREF(r);
    }
    Py_DECREF(now);
    return res;
}

/* A stdlib get(q[, block]) that found nothing to read, recorded as a wait (see above). */
static PyObject *
waited_get(Hook *h, Writer *w, PyObject *const *args, size_t nargsf)
{
    PyObject *qid = NULL;
    if (optional_attr(args[0], QID, &qid) < 0)                  /* messages._queue_id(q) */
        return NULL;
    if (qid == NULL && (qid = PyObject_CallOneArg(h->queue_id, args[0])) == NULL)
        return NULL;
    PyObject *res = record_get_wait(w, qid, NULL, h->call, args, nargsf);
    Py_DECREF(qid);
    return res;
}

/* messages.get_would_wait in C (installed by messages.install_native): whether q.get() would
   wait now -- nothing in q._reader's pipe, and not already inside a get recorded as a wait. */
static PyObject *
get_would_wait_function(PyObject *module, PyObject *q)
{
    PyObject *reader = NULL, *handle = NULL;
    if (in_get_wait)
        Py_RETURN_FALSE;
    if (optional_attr(q, READER, &reader) < 0)
        return NULL;
    if (reader != NULL && optional_attr(reader, HANDLE, &handle) < 0) {
        Py_DECREF(reader);
        return NULL;
    }
    Py_XDECREF(reader);
    long fd = handle != NULL && PyLong_Check(handle) ? PyLong_AsLong(handle) : -1;
    Py_XDECREF(handle);
    if (fd < 0 || fd > INT32_MAX) {         /* closed (None): the get itself says so */
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    /* a message (or EOF) is there, or poll failed -- and no other reader holds the read lock */
    if (fd_readable((int)fd) != 0 && !read_lock_held(q))
        Py_RETURN_FALSE;
    int inside = inside_wait();             /* inside another recorded wait: not recorded */
    if (inside < 0)
        return NULL;
    return PyBool_FromLong(!inside);
}

/* messages.waiting_get in C: waiting_get(timeout, get, q, *more) -- get(q, *more) recorded as a
   wait on q (whose id messages.watch_reads or _simple_get has set already), `timeout` the get's
   for the event; unrecorded if the C Writer is not recording. */
static PyObject *
waiting_get_function(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc < 3) {
        PyErr_SetString(PyExc_TypeError,
                        "waiting_get(timeout, get, q, *more) takes at least 3 arguments");
        return NULL;
    }
    PyObject *w = recording_writer(), *qid = NULL, *res;
    if (optional_attr(argv[2], QID, &qid) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    if (Py_IS_TYPE(w, &WriterType) && qid != NULL)
        res = record_get_wait((Writer *)w, qid, argv[0], argv[1], argv + 2, (size_t)(argc - 2));
    else
        res = PyObject_Vectorcall(argv[1], argv + 2, (size_t)(argc - 2), NULL);
    Py_XDECREF(qid);
    Py_DECREF(w);
    return res;
}

/* messages.got in C (see end_get_wait): called after a queue.get recorded by Python code (an
   envelope's _open) while the C Writer records. */
static PyObject *
got_function(PyObject *module, PyObject *qid)
{
    if (end_get_wait(qid) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* waits._outermost in C (messages.install_native puts it there while the C Writer records):
   recording, and this thread not inside a recorded wait (inside_wait). */
static PyObject *
outermost_function(PyObject *module, PyObject *unused)
{
    if (current_writer == NULL)
        Py_RETURN_FALSE;
    int inside = inside_wait();
    return inside < 0 ? NULL : PyBool_FromLong(!inside);
}

/* messages._not_in_a_wait in C (the same, without asking whether we record). */
static PyObject *
not_in_a_wait_function(PyObject *module, PyObject *unused)
{
    int inside = inside_wait();
    return inside < 0 ? NULL : PyBool_FromLong(!inside);
}

static PyObject *
set_in_wait_function(PyObject *module, PyObject *local)
{
    Py_XSETREF(in_wait_local, Py_NewRef(local));
    Py_RETURN_NONE;
}

/* Whether put(q, ...) may wait now: a bounded queue (q._maxsize below the semaphore's limit)
   whose semaphore is at zero (q._sem._semlock._is_zero()). 1, 0, or -1 with an error set. An
   unbounded queue costs one attribute read. */
static int
put_may_wait(PyObject *q)
{
    PyObject *v = NULL;
    if (optional_attr(q, MAXSIZE, &v) < 0)
        return -1;
    long maxsize = v != NULL && PyLong_Check(v) ? PyLong_AsLong(v) : LONG_MAX;
    Py_XDECREF(v);
    if (maxsize == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (maxsize >= INT_MAX || maxsize <= 0)     /* SEM_VALUE_MAX (Linux): unbounded */
        return 0;
    PyObject *sem = PyObject_GetAttr(q, SEM);
    PyObject *semlock = sem != NULL ? PyObject_GetAttr(sem, SEMLOCK) : NULL;
    PyObject *zero = semlock != NULL ? PyObject_CallMethodNoArgs(semlock, IS_ZERO) : NULL;
    Py_XDECREF(sem);
    Py_XDECREF(semlock);
    if (zero == NULL) {                          /* not a stdlib Queue's: the Python hook asks */
        PyErr_Clear();
        return 1;
    }
    int r = PyObject_IsTrue(zero);
    Py_DECREF(zero);
    return r;
}

static PyObject *
Hook_vectorcall(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (h->call == NULL) {
        PyErr_SetString(PyExc_TypeError, "Hook.__init__() was not called");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1)                                   /* the queue by keyword: the Python hook */
        return PyObject_Vectorcall(h->slow, args, nargsf, kwnames);
    if (!h->is_put)
        return hook_get(h, args, nargsf, kwnames);
    if (nargs > 4 || kwnames != NULL)   /* put(q, obj, block, timeout) by position only here */
        return PyObject_Vectorcall(h->slow, args, nargsf, kwnames);
    PyObject *w = recording_writer(), *res;
    int slow = 0;
    if (w != Py_None && Py_IS_TYPE(w, &WriterType) && nargs >= 2) {
        /* a put into a full bounded queue waits: the Python hook records that wait */
        slow = blocks(args, nargs, 2);
        if (slow > 0)
            slow = put_may_wait(args[0]);
        if (slow < 0) {
            Py_DECREF(w);
            return NULL;
        }
    }
    if (w == Py_None)                               /* not recording: the stdlib's put */
        res = PyObject_Vectorcall(h->call, args, nargsf, kwnames);
    else if (!Py_IS_TYPE(w, &WriterType) || nargs < 2 || slow)
        res = PyObject_Vectorcall(h->slow, args, nargsf, kwnames);   /* Python Writer, a wait */
    else
        res = hook_put(h, (Writer *)w, args, nargsf, kwnames);
    Py_DECREF(w);
    return res;
}

/* Anything else a Hook is asked for (__name__, __qualname__, __doc__, __code__, ...) is the
   stdlib method's: code that looks at q.put while we record sees what it would see anyway. */
static PyObject *
Hook_getattro(Hook *h, PyObject *name)
{
    if (h->call != NULL && PyUnicode_Check(name)
            && (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0
                || PyUnicode_CompareWithASCIIString(name, "__module__") == 0))
        return PyObject_GetAttr(h->call, name);     /* not the Hook type's own */
    PyObject *v = PyObject_GenericGetAttr((PyObject *)h, name);
    if (v != NULL || h->call == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return v;
    PyErr_Clear();
    return PyObject_GetAttr(h->call, name);
}

/* As a function is: h.__get__(q) is a bound method. */
static PyObject *
Hook_descr_get(PyObject *h, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(h);
    return PyMethod_New(h, obj);
}

static int
Hook_init(Hook *h, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"kind", "call", "slow", "messages", NULL};
    const char *kind;
    PyObject *call, *slow, *messages;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOOO:Hook", names, &kind, &call, &slow,
                                     &messages))
        return -1;
    if (strcmp(kind, "put") != 0 && strcmp(kind, "get") != 0) {
        PyErr_Format(PyExc_ValueError, "Hook kind must be 'put' or 'get', not '%s'", kind);
        return -1;
    }
    PyObject *queue_id = PyObject_GetAttrString(messages, "_queue_id");
    PyObject *for_feeder = PyObject_GetAttrString(messages, "for_feeder");
    PyObject *put_failed = PyObject_GetAttrString(messages, "put_failed");
    if (queue_id == NULL || for_feeder == NULL || put_failed == NULL) {
        Py_XDECREF(queue_id);
        Py_XDECREF(for_feeder);
        Py_XDECREF(put_failed);
        return -1;
    }
    h->is_put = kind[0] == 'p';
    Py_XSETREF(h->call, Py_NewRef(call));
    Py_XSETREF(h->slow, Py_NewRef(slow));
    Py_XSETREF(h->queue_id, queue_id);
    Py_XSETREF(h->for_feeder, for_feeder);
    Py_XSETREF(h->put_failed, put_failed);
    h->vectorcall = (vectorcallfunc)Hook_vectorcall;
    return 0;
}

static int
Hook_traverse(Hook *h, visitproc visit, void *arg)
{
    Py_VISIT(h->call);
    Py_VISIT(h->slow);
    Py_VISIT(h->queue_id);
    Py_VISIT(h->for_feeder);
    Py_VISIT(h->put_failed);
    return 0;
}

static int
Hook_clear(Hook *h)
{
    Py_CLEAR(h->call);
    Py_CLEAR(h->slow);
    Py_CLEAR(h->queue_id);
    Py_CLEAR(h->for_feeder);
    Py_CLEAR(h->put_failed);
    return 0;
}

static void
Hook_dealloc(Hook *h)
{
    PyObject_GC_UnTrack(h);
    Hook_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMemberDef Hook_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Hook, call), READONLY, "the stdlib's method"},
    {NULL}
};

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpviz._speedups._writer.Hook",
    .tp_doc = "Hook(kind, call, slow, messages): a Queue's put or get while "
              "recording (messages.py's, in C)",
    .tp_basicsize = sizeof(Hook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = Hook_descr_get,
    .tp_getattro = (getattrofunc)Hook_getattro,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hook_init,
    .tp_dealloc = (destructor)Hook_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Hook_traverse,
    .tp_clear = (inquiry)Hook_clear,
    .tp_members = Hook_members,
};

static PyObject *
take_feeding_function(PyObject *module, PyObject *unused)
{
    PyObject *msg = take_feeding_msg();
    return msg != NULL ? msg : Py_NewRef(Py_None);
}

static PyObject *
set_feeding_handles_function(PyObject *module, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    feeding_handles = n;
    Py_RETURN_NONE;
}

static PyObject *
readable_function(PyObject *module, PyObject *arg)
{
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0)
        return NULL;
    int r = fd_readable(fd);
    if (r < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(r);
}
