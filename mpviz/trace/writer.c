/* writer.c -- the recorder's Writer in C: the same records as recorder.py's Writer, ~7x faster.

recorder.py's ``Writer`` is the reference: read it first. This file does the same steps, in the
same order, and writes the same bytes (tests/test_trace_writer.py compares the two):

    emit(kind, args)                    mark(name, args) is emit("mark", {"name": name, **args})
      1. ts  = clock_gettime(CLOCK_MONOTONIC)       (what time.monotonic_ns() reads on Linux)
         tid = the OS thread id, asked once per thread and kept in a thread-local variable
      2. encode into a scratch buffer (on the stack unless the event is large):
            [u32 n][u32 adler32(body)] [u64 ts][u64 tid][u8 k][kind][args as marshal version 2]
                                       '------------------ body: n bytes ---------------------'
      3. append to the mapped chunk: copy checksum + body, then store the length word last
         (a record exists for a reader once its length is there)
      4. no room left: if the record cannot fit in this chunk at all, write the PAD word; mark
         the chunk "sealed" and call on_full(), which reserves more of the chunk on disk and
         hands it back with use(mm, pos, end), or maps the next chunk (use(mm, 0, end)); then
         go back to 3.

Where the Python Writer's time goes (~2 µs a mark on a slow machine), and what this file does:

    marshal.dumps(args, 2)   a general serializer: ~250 ns    str/int/float/bool/None are written
                                                              here in marshal's own layout (the
                                                              reader's marshal.loads reads them);
                                                              anything else is handed to marshal
    a Python lock            ~60 ns                           no lock: see below
    clock, thread id, the    ~100 ns each call                C calls; the thread id cached
    checksum, struct.pack

The GIL is the lock. Step 3 is plain C: it calls no Python code, so no other thread can run
between finding room for a record and committing it. The one call out to Python, on_full() in
step 4, happens with the chunk sealed: the threads that run meanwhile find no room either, and
wait in on_full() for the one new chunk.

Every failure of the Writer (an argument marshal cannot encode, a full disk while mapping a new
chunk) is passed to on_error(kind, exception) instead of being raised: a recorder must never break
the program it observes. (The recorder's own on_error warns and stops recording; a test's SideLog
raises.) Tap goes further: whatever fails while it records, the message it carries goes through.
The one exception to both: what is not an Exception (KeyboardInterrupt, SystemExit) goes up to
the caller, as from the Python Writer and hooks -- a Ctrl-C stops the program, not only its
recording (and a message a Tap had read then is lost with the get it belonged to).

The same file has the per-message Queue hooks of messages.py in C, so that recording a message
runs no Python function of ours: ``Tap`` (a Queue's pipe read and its feeder's write, each with
its event), and ``Tag``, ``Pickler`` and ``Hook`` (put, the feeder's pickling, get). See the
sections at their definitions; messages.py's Python versions are the reference.

Built and loaded on first use by native.py; when it cannot be built, the Python Writer is used.
Left out (the Python Writer covers them): platforms other than Linux, big-endian machines, and
Pythons without a GIL.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <structmember.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>

#if !defined(__linux__)
#error "the C writer is for Linux; elsewhere mpviz uses the pure-Python Writer"
#endif
#if !PY_LITTLE_ENDIAN
#error "the C writer writes little-endian records by copying; use the pure-Python Writer"
#endif

#define RECORD_HEADER 8              /* u32 length n + u32 adler32 of the body */
#define BODY_HEADER 17               /* u64 ts + u64 tid + u8 length of the kind */
#define PAD 0xFFFFFFFFu

/* --- the thread id, cached per thread ------------------------------------------------------ */

static __thread unsigned long cached_tid;    /* 0: not asked yet in this thread */

static void forget_tid_in_child(void) { cached_tid = 0; }   /* a forked child: a new thread id */

static unsigned long
thread_id(void)
{
    if (cached_tid == 0)
        cached_tid = PyThread_get_thread_native_id();   /* threading.get_native_id() */
    return cached_tid;
}

/* --- a growable scratch buffer: on the stack for the usual small event ---------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    char small[512];
} Buf;

static void buf_init(Buf *b) { b->p = b->small; b->len = 0; b->cap = sizeof b->small; }
static void buf_free(Buf *b) { if (b->p != b->small) PyMem_Free(b->p); }

static char *
buf_grow(Buf *b, size_t n)               /* the rare case: move to a larger buffer on the heap */
{
    size_t cap = (b->len + n) * 2;
    char *p = PyMem_Malloc(cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(p, b->p, b->len);
    buf_free(b);
    b->p = p;
    b->cap = cap;
    return p + b->len;
}

/* Room for n more bytes: where they go (NULL: out of memory). */
static inline char *
reserve(Buf *b, size_t n)
{
    char *at = b->len + n <= b->cap ? b->p + b->len : buf_grow(b, n);
    if (at != NULL)
        b->len += n;
    return at;
}

/* A type code followed by a fixed-size little-endian value (the host is little endian). */
static inline int
put_code(Buf *b, char code, const void *value, size_t n)
{
    char *at = reserve(b, 1 + n);
    if (at == NULL)
        return -1;
    at[0] = code;
    memcpy(at + 1, value, n);                /* n is a constant at every call: no call here */
    return 0;
}

static inline int
put_char(Buf *b, char code)
{
    char *at = reserve(b, 1);
    if (at == NULL)
        return -1;
    at[0] = code;
    return 0;
}

static inline int
put_bytes(Buf *b, const void *data, size_t n)
{
    char *at = reserve(b, n);
    if (at == NULL)
        return -1;
    memcpy(at, data, n);
    return 0;
}

/* --- args in marshal's version-2 layout (Python/marshal.c, w_object) ------------------------ */

static int
put_marshalled(Buf *b, PyObject *v)          /* anything else: ask marshal itself */
{
    PyObject *bytes = PyMarshal_WriteObjectToString(v, 2);
    if (bytes == NULL)
        return -1;
    int r = put_bytes(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
    Py_DECREF(bytes);
    return r;
}

static int
put_llong(Buf *b, long long x)               /* a C integer, as marshal writes an int */
{
    if (x >= INT32_MIN && x <= INT32_MAX) {      /* 'i' + 4 bytes */
        int32_t x32 = (int32_t)x;
        return put_code(b, 'i', &x32, 4);
    }
    /* 'l' + signed count of 15-bit digits + the digits, least significant first */
    unsigned long long m = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    uint16_t digits[5];
    int32_t count = 0;
    while (m) {
        digits[count++] = (uint16_t)(m & 0x7FFF);
        m >>= 15;
    }
    int32_t signed_count = x < 0 ? -count : count;
    if (put_code(b, 'l', &signed_count, 4))
        return -1;
    return put_bytes(b, digits, 2 * (size_t)count);
}

static int
put_int(Buf *b, PyObject *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return put_marshalled(b, v);             /* beyond 64 bits */
    return put_llong(b, x);
}

/* The UTF-8 bytes of a str; NULL (no error set) if it has none (a lone surrogate). */
static inline const char *
utf8_of(PyObject *s, Py_ssize_t *n)
{
    if (PyUnicode_IS_COMPACT_ASCII(s)) {      /* most names: the characters are the bytes */
        *n = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_DATA(s);
    }
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, n);
    if (utf8 == NULL)
        PyErr_Clear();
    return utf8;
}

static int
put_str(Buf *b, PyObject *v)                 /* 'u' + u32 length + UTF-8 */
{
    Py_ssize_t n;
    const char *utf8 = utf8_of(v, &n);
    if (utf8 == NULL || (size_t)n > INT32_MAX)
        return put_marshalled(b, v);         /* surrogates: marshal encodes those */
    uint32_t n32 = (uint32_t)n;
    if (put_code(b, 'u', &n32, 4))
        return -1;
    return put_bytes(b, utf8, (size_t)n);
}

static int
put_value(Buf *b, PyObject *v)
{
    if (PyUnicode_CheckExact(v))
        return put_str(b, v);
    if (PyLong_CheckExact(v))
        return put_int(b, v);
    if (v == Py_None)
        return put_char(b, 'N');
    if (v == Py_True)
        return put_char(b, 'T');
    if (v == Py_False)
        return put_char(b, 'F');
    if (PyFloat_CheckExact(v)) {             /* 'g' + the 8 bytes of the double */
        double d = PyFloat_AS_DOUBLE(v);
        return put_code(b, 'g', &d, 8);
    }
    return put_marshalled(b, v);             /* list, dict, tuple, bytes, ... */
}

static PyObject *NAME, *MARK;               /* the strs "name" and "mark" */

/* '{' key value key value ... '0'; with a `name` (a user's mark), "name": name comes first. */
static int
put_args(Buf *b, PyObject *name, PyObject *args)
{
    if (!PyDict_CheckExact(args)) {
        if (name == NULL)
            return put_marshalled(b, args);
        PyErr_SetString(PyExc_TypeError, "mark(name, args): args must be a dict");
        return -1;
    }
    Py_ssize_t i = 0;
    PyObject *key, *value;
    if (put_char(b, '{'))
        return -1;
    if (name != NULL && (put_value(b, NAME) || put_value(b, name)))
        return -1;
    while (PyDict_Next(args, &i, &key, &value))
        if (put_value(b, key) || put_value(b, value))
            return -1;
    return put_char(b, '0');
}

/* --- the checksum: Adler-32, as zlib.adler32 computes it ------------------------------------ */

#if defined(__SSE2__)
#include <emmintrin.h>

static inline uint32_t
sum_lanes(__m128i v)                        /* the four 32-bit lanes added up */
{
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(v);
}
#endif

static uint32_t
adler32(const unsigned char *p, size_t n)
{
    /* a = 1 + the sum of the bytes, s = the sum of the a's after each byte, both mod 65521.
       16 bytes at a time (SSE2): a block adds its byte sum to a, and to s it adds 16 times the
       a it started with plus its bytes weighted 16, 15, ..., 1. The rest one byte at a time. */
    uint32_t a = 1, s = 0;
    while (n > 0) {
        size_t block = n < 5552 ? n : 5552;  /* the most bytes before s can overflow 32 bits */
        n -= block;
#if defined(__SSE2__)
        size_t blocks = block / 16;
        if (blocks > 0) {
            const __m128i zero = _mm_setzero_si128();
            const __m128i first8 = _mm_setr_epi16(16, 15, 14, 13, 12, 11, 10, 9);
            const __m128i last8 = _mm_setr_epi16(8, 7, 6, 5, 4, 3, 2, 1);
            __m128i sums = zero, starts = zero, weighted = zero;
            for (size_t i = 0; i < blocks; i++, p += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)p);
                starts = _mm_add_epi32(starts, sums);          /* the byte sum before it */
                sums = _mm_add_epi32(sums, _mm_sad_epu8(v, zero));
                weighted = _mm_add_epi32(weighted,
                                         _mm_madd_epi16(_mm_unpacklo_epi8(v, zero), first8));
                weighted = _mm_add_epi32(weighted,
                                         _mm_madd_epi16(_mm_unpackhi_epi8(v, zero), last8));
            }
            uint64_t s64 = s + (uint64_t)blocks * 16 * a + 16 * (uint64_t)sum_lanes(starts)
                           + sum_lanes(weighted);
            a = (uint32_t)((a + (uint64_t)sum_lanes(sums)) % 65521);
            s = (uint32_t)(s64 % 65521);
            block -= blocks * 16;
        }
#else
        for (; block >= 4; block -= 4, p += 4) {
            s += 4 * a + 4 * p[0] + 3 * p[1] + 2 * p[2] + p[3];
            a += p[0] + p[1] + p[2] + p[3];
        }
#endif
        for (; block > 0; block--) {
            a += *p++;
            s += a;
        }
        a %= 65521;
        s %= 65521;
    }
    return (s << 16) | a;
}

/* One event, encoded: record header (length, checksum) + body. In three steps, so that the
   Queue hooks below can write their few known args without building a dict:
   begin_record (header and kind), the args, end_record (length and checksum). */
static int
begin_record(Buf *b, uint64_t ts, uint64_t tid, PyObject *kind)
{
    Py_ssize_t k;
    const char *kind_utf8;
    if (!PyUnicode_Check(kind)) {
        PyErr_Format(PyExc_TypeError, "event kind must be a str, not %.100s",
                     Py_TYPE(kind)->tp_name);
        return -1;
    }
    if (PyUnicode_IS_COMPACT_ASCII(kind)) {
        k = PyUnicode_GET_LENGTH(kind);
        kind_utf8 = (const char *)PyUnicode_DATA(kind);
    }
    else if ((kind_utf8 = PyUnicode_AsUTF8AndSize(kind, &k)) == NULL)
        return -1;
    if (k > 255) {
        PyErr_Format(PyExc_ValueError, "event kind %R is longer than 255 bytes", kind);
        return -1;
    }
    char *at = reserve(b, RECORD_HEADER + BODY_HEADER + (size_t)k);   /* filled in below */
    if (at == NULL)
        return -1;
    memcpy(at + RECORD_HEADER, &ts, 8);
    memcpy(at + RECORD_HEADER + 8, &tid, 8);
    at[RECORD_HEADER + 16] = (char)k;
    memcpy(at + RECORD_HEADER + BODY_HEADER, kind_utf8, (size_t)k);
    return 0;
}

static int
end_record(Buf *b)
{
    size_t n = b->len - RECORD_HEADER;
    if (n > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "event larger than 4 GiB");
        return -1;
    }
    uint32_t length = (uint32_t)n, check = adler32((unsigned char *)b->p + RECORD_HEADER, n);
    memcpy(b->p, &length, 4);
    memcpy(b->p + 4, &check, 4);
    return 0;
}

static int
encode(Buf *b, uint64_t ts, uint64_t tid, PyObject *kind, PyObject *name, PyObject *args)
{
    if (begin_record(b, ts, tid, kind) || put_args(b, name, args))
        return -1;
    return end_record(b);
}

/* --- the Writer ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_buffer chunk;         /* the mapped chunk we append to (borrowed from an mmap object) */
    int sealed;              /* 1: no chunk, or the current one is full (PAD written) */
    Py_ssize_t pos;          /* where the next record goes in the chunk */
    Py_ssize_t end;          /* the chunk's bytes reserved on disk so far: records go below */
    Py_ssize_t max_record;   /* larger events cannot fit in any chunk */
    PyObject *on_full;       /* on_full() -> True once use() got a fresh chunk, False: stopped */
    PyObject *on_error;      /* on_error(kind, exception): a failure, reported, never raised */
} Writer;

static void
release_chunk(Writer *w)
{
    if (w->chunk.obj != NULL)
        PyBuffer_Release(&w->chunk);        /* sets chunk.obj to NULL */
    w->sealed = 1;
}

/* Steps 3 and 4. Returns 0 when written (or dropped because recording stopped), -1 on error. */
static int
append(Writer *w, const Buf *b)
{
    if ((Py_ssize_t)b->len > w->max_record) {
        PyErr_Format(PyExc_ValueError, "event of %zd bytes is larger than a log chunk (at most "
                     "%zd bytes)", (Py_ssize_t)b->len, w->max_record);
        return -1;
    }
    for (;;) {
        if (!w->sealed && w->pos + (Py_ssize_t)b->len <= w->end) {
            char *at = (char *)w->chunk.buf + w->pos;
            memcpy(at + 4, b->p + 4, b->len - 4);           /* checksum and body first ... */
            __atomic_thread_fence(__ATOMIC_RELEASE);
            memcpy(at, b->p, 4);                            /* ... then the length commits it */
            w->pos += (Py_ssize_t)b->len;
            return 0;
        }
        if (!w->sealed) {          /* no room: pad if the chunk is full, then ask for more */
            if (w->pos + (Py_ssize_t)b->len > w->chunk.len && w->end - w->pos >= 4) {
                uint32_t pad = PAD;
                memcpy((char *)w->chunk.buf + w->pos, &pad, 4);
            }
            w->sealed = 1;
        }
        /* on_full() reserves more of this chunk (no PAD written) or maps the next one.
           Calling Python may let other threads run: they see the chunk sealed and wait for
           the same on_full, which makes room once for all of them. */
        PyObject *r = PyObject_CallNoArgs(w->on_full);
        if (r == NULL)
            return -1;
        int fresh = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (fresh <= 0)
            return fresh;                    /* 0: recording stopped, the event is dropped */
    }
}

/* The error now set goes to on_error(kind, exception) instead of up to the caller -- if it is
   an Exception. KeyboardInterrupt, SystemExit and the like go up, as from the Python Writer
   (which catches Exception): a Ctrl-C while a chunk is being mapped must stop the program,
   not just its recording. */
static PyObject *
report_error(Writer *w, PyObject *kind)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *res = PyObject_CallFunctionObjArgs(w->on_error, kind, value ? value : Py_None,
                                                 NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (res == NULL)
        return NULL;                         /* on_error itself failed (a warning as error) */
    Py_DECREF(res);
    Py_RETURN_NONE;
}

static PyObject *
write_event(Writer *w, uint64_t ts, PyObject *kind, PyObject *name, PyObject *args)
{
    Buf b;
    buf_init(&b);
    int r = encode(&b, ts, thread_id(), kind, name, args);
    if (r == 0)
        r = append(w, &b);
    buf_free(&b);
    if (r < 0)
        return report_error(w, kind);
    Py_RETURN_NONE;
}

/* A Queue event: {"queue": queue, ["msg": msg,] ["nbytes": n, "sig": sig]} -- the dict
   messages.py builds, written straight into the record (a dict costs more than the rest of the
   event). With `data`: its size and sig, the Adler-32 of its last 32 bytes (recorder.sig). */
static PyObject *QUEUE, *MSG, *NBYTES, *SIG, *EMIT_AT, *HANDLE;   /* interned strs */

/* recorder.writer, as recorder.py last set it (set_writer, called by recorder._set_writer
   at every change, and by native.load before any hook exists); NULL for None. The hooks read
   it here: a module attribute would cost them a lookup per message. */
static PyObject *current_writer;

static PyObject *
set_writer_function(PyObject *module, PyObject *w)
{
    Py_XSETREF(current_writer, w == Py_None ? NULL : Py_NewRef(w));
    Py_RETURN_NONE;
}

/* The Writer recording now, or None (a new reference). */
static PyObject *
recording_writer(void)
{
    return Py_NewRef(current_writer != NULL ? current_writer : Py_None);
}

static PyObject *
write_queue_event(Writer *w, uint64_t ts, PyObject *kind, PyObject *queue, PyObject *msg,
                  const Py_buffer *data)
{
    Buf b;
    buf_init(&b);
    /* the keys as put_str writes them: 'u', a u32 length, the characters (and '{' first) */
    static const char open_queue[] = "{u\5\0\0\0queue", key_msg[] = "u\3\0\0\0msg";
    static const char key_nbytes[] = "u\6\0\0\0nbytes", key_sig[] = "u\3\0\0\0sig";
    int r = begin_record(&b, ts, thread_id(), kind);
    if (r == 0)
        r = put_bytes(&b, open_queue, sizeof open_queue - 1) || put_value(&b, queue);
    if (r == 0 && msg != NULL)
        r = put_bytes(&b, key_msg, sizeof key_msg - 1) || put_value(&b, msg);
    if (r == 0 && data != NULL) {
        Py_ssize_t n = data->len, k = n < 32 ? n : 32;
        uint32_t sig = adler32((const unsigned char *)data->buf + (n - k), (size_t)k);
        r = put_bytes(&b, key_nbytes, sizeof key_nbytes - 1) || put_llong(&b, (long long)n)
            || put_bytes(&b, key_sig, sizeof key_sig - 1) || put_llong(&b, (long long)sig);
    }
    if (r == 0)
        r = put_char(&b, '0') || end_record(&b);
    if (r == 0)
        r = append(w, &b);
    buf_free(&b);
    if (r != 0)                          /* (a failed `a || b` above leaves 1, not -1) */
        return report_error(w, kind);
    Py_RETURN_NONE;
}

static uint64_t
now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int
check_args(Writer *w, Py_ssize_t argc, Py_ssize_t expected, const char *usage)
{
    if (w->on_full == NULL || w->on_error == NULL) {
        PyErr_SetString(PyExc_TypeError, "Writer.__init__() was not called");
        return -1;
    }
    if (argc != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, expected);
        return -1;
    }
    return 0;
}

static PyObject *
Writer_emit(Writer *w, PyObject *const *argv, Py_ssize_t argc)
{
    if (check_args(w, argc, 2, "emit(kind, args)"))
        return NULL;
    return write_event(w, now_ns(), argv[0], NULL, argv[1]);
}

static PyObject *
Writer_emit_at(Writer *w, PyObject *const *argv, Py_ssize_t argc)
{
    if (check_args(w, argc, 3, "emit_at(ts_ns, kind, args)"))
        return NULL;
    uint64_t ts = PyLong_AsUnsignedLongLong(argv[0]);
    if (ts == (uint64_t)-1 && PyErr_Occurred())
        return report_error(w, argv[1]);
    return write_event(w, ts, argv[1], NULL, argv[2]);
}

static PyObject *
Writer_queue_event(Writer *w, PyObject *const *argv, Py_ssize_t argc)
{
    if (check_args(w, argc, 5, "queue_event(ts_ns, kind, queue, msg, data)"))
        return NULL;
    uint64_t ts = PyLong_AsUnsignedLongLong(argv[0]);
    if (ts == (uint64_t)-1 && PyErr_Occurred())
        return report_error(w, argv[1]);
    Py_buffer data;
    if (PyObject_GetBuffer(argv[4], &data, PyBUF_SIMPLE) < 0)
        return report_error(w, argv[1]);
    PyObject *res = write_queue_event(w, ts, argv[1], argv[2], argv[3], &data);
    PyBuffer_Release(&data);
    return res;
}

static PyObject *
Writer_mark(Writer *w, PyObject *const *argv, Py_ssize_t argc)
{
    if (check_args(w, argc, 2, "mark(name, args)"))
        return NULL;
    return write_event(w, now_ns(), MARK, argv[0], argv[1]);
}

static PyObject *
Writer_use(Writer *w, PyObject *const *argv, Py_ssize_t argc)
{
    if (check_args(w, argc == 3 ? 2 : argc, 2, "use(mm, pos[, end])"))
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(argv[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = -1;                         /* -1: the whole chunk is reserved */
    if (argc == 3 && argv[2] != Py_None) {
        end = PyLong_AsSsize_t(argv[2]);
        if (end == -1 && PyErr_Occurred())
            return NULL;
    }
    release_chunk(w);
    if (argv[0] != Py_None) {
        if (PyObject_GetBuffer(argv[0], &w->chunk, PyBUF_WRITABLE) < 0)
            return NULL;
        if (end < 0)
            end = w->chunk.len;
        if (pos < 0 || end > w->chunk.len || pos > end) {
            release_chunk(w);
            PyErr_SetString(PyExc_ValueError, "use(): pos or end outside the chunk");
            return NULL;
        }
        w->pos = pos;
        w->end = end;
        w->sealed = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
encode_function(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "encode(ts_ns, tid, kind, args) takes 4 arguments");
        return NULL;
    }
    uint64_t ts = PyLong_AsUnsignedLongLong(argv[0]), tid = PyLong_AsUnsignedLongLong(argv[1]);
    if (PyErr_Occurred())
        return NULL;
    Buf b;
    buf_init(&b);
    PyObject *out = NULL;
    if (encode(&b, ts, tid, argv[2], NULL, argv[3]) == 0)
        out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
    buf_free(&b);
    return out;
}

static int
Writer_init(Writer *w, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"on_full", "on_error", "max_record", NULL};
    PyObject *on_full, *on_error;
    Py_ssize_t max_record;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOn:Writer", names, &on_full, &on_error,
                                     &max_record))
        return -1;
    Py_INCREF(on_full);
    Py_INCREF(on_error);
    Py_XSETREF(w->on_full, on_full);
    Py_XSETREF(w->on_error, on_error);
    w->max_record = max_record;
    release_chunk(w);
    return 0;
}

static void
Writer_dealloc(Writer *w)
{
    PyObject_GC_UnTrack(w);
    release_chunk(w);
    Py_CLEAR(w->on_full);
    Py_CLEAR(w->on_error);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static int
Writer_traverse(Writer *w, visitproc visit, void *arg)
{
    Py_VISIT(w->on_full);
    Py_VISIT(w->on_error);
    Py_VISIT(w->chunk.obj);
    return 0;
}

static int
Writer_clear(Writer *w)
{
    release_chunk(w);
    Py_CLEAR(w->on_full);
    Py_CLEAR(w->on_error);
    return 0;
}

static PyObject *Writer_get_pos(Writer *w, void *closure) { return PyLong_FromSsize_t(w->pos); }
static PyObject *Writer_get_sealed(Writer *w, void *closure) { return PyBool_FromLong(w->sealed); }

static PyMethodDef Writer_methods[] = {
    {"emit", (PyCFunction)(void (*)(void))Writer_emit, METH_FASTCALL,
     "emit(kind, args): record an event now"},
    {"emit_at", (PyCFunction)(void (*)(void))Writer_emit_at, METH_FASTCALL,
     "emit_at(ts_ns, kind, args): record an event with an earlier timestamp"},
    {"mark", (PyCFunction)(void (*)(void))Writer_mark, METH_FASTCALL,
     "mark(name, args): emit(\"mark\", {\"name\": name, **args}) without building that dict"},
    {"queue_event", (PyCFunction)(void (*)(void))Writer_queue_event, METH_FASTCALL,
     "queue_event(ts_ns, kind, queue, msg, data): emit_at(ts_ns, kind, {queue, msg, nbytes, "
     "sig}) for the bytes in data, without building that dict"},
    {"use", (PyCFunction)(void (*)(void))Writer_use, METH_FASTCALL,
     "use(mm, pos, end=len(mm)): append to this mapped chunk from pos on, below end (None: "
     "no chunk)"},
    {NULL}
};

static PyGetSetDef Writer_getset[] = {
    {"pos", (getter)Writer_get_pos, NULL, "where the next record goes in the chunk", NULL},
    {"sealed", (getter)Writer_get_sealed, NULL, "True when the chunk is full or absent", NULL},
    {NULL}
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpviz.trace._writer.Writer",
    .tp_doc = "Writer(on_full, on_error, max_record): appends events to a mapped log chunk",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Writer_traverse,
    .tp_clear = (inquiry)Writer_clear,
    .tp_methods = Writer_methods,
    .tp_getset = Writer_getset,
};

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
       raised in its place -- but for a Ctrl-C (see the top of this file).

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

/* {queue, [msg,] nbytes, sig} for the bytes in `data`, appended at ts by the Writer recording. */
static int
tap_emit(Tap *t, uint64_t ts, PyObject *msg, const Py_buffer *data)
{
    PyObject *w = recording_writer(), *res = NULL;
    if (w == Py_None)                                       /* not recording */
        res = Py_NewRef(Py_None);
    else if (Py_IS_TYPE(w, &WriterType))                    /* the usual case: no dict */
        res = write_queue_event((Writer *)w, ts, t->kind, t->queue, msg, data);
    else {                                                  /* the Python Writer */
        Py_ssize_t n = data->len, k = n < 32 ? n : 32;
        uint32_t sig = adler32((const unsigned char *)data->buf + (n - k), (size_t)k);
        PyObject *args = PyDict_New(), *nbytes = PyLong_FromSsize_t(n);
        PyObject *check = PyLong_FromUnsignedLong(sig), *when = PyLong_FromUnsignedLongLong(ts);
        if (args != NULL && nbytes != NULL && check != NULL && when != NULL
                && PyDict_SetItem(args, QUEUE, t->queue) == 0
                && (msg == NULL || PyDict_SetItem(args, MSG, msg) == 0)
                && PyDict_SetItem(args, NBYTES, nbytes) == 0
                && PyDict_SetItem(args, SIG, check) == 0)
            res = PyObject_CallMethodObjArgs(w, EMIT_AT, when, t->kind, args, NULL);
        Py_XDECREF(args);
        Py_XDECREF(nbytes);
        Py_XDECREF(check);
        Py_XDECREF(when);
    }
    Py_DECREF(w);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
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
                r = tap_emit(t, now_ns(), msg, &data);
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
                               (size_t)PyBytes_GET_SIZE(t->skip)) == NULL)
        r = tap_emit(t, now_ns(), NULL, &data);
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
    .tp_name = "mpviz.trace._writer.Tap",
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
    .tp_name = "mpviz.trace._writer.Tag",
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
    .tp_name = "mpviz.trace._writer.Pickler",
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
        PyObject *r = write_queue_event(w, now_ns(), PUT_KIND, qid, msg, NULL);
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

/* messages._queue_get: the stdlib's get, its read wrapped in a Tap first. A queue whose read is
   a Tap already needs nothing more (the Tap itself sees whether we record); any other goes to
   the Python hook while recording, which wraps it, and straight to the stdlib's get if not. */
static PyObject *
hook_get(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *read = NULL;
    if (optional_attr(args[0], RECV_BYTES, &read) < 0)
        return NULL;
    int tapped = read != NULL && Py_IS_TYPE(read, &TapType);
    Py_XDECREF(read);
    if (tapped)
        return PyObject_Vectorcall(h->call, args, nargsf, kwnames);
    int recording = current_writer != NULL;    /* (recorder.ENABLED) */
    return PyObject_Vectorcall(recording ? h->slow : h->call, args, nargsf, kwnames);
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
    if (w == Py_None)                               /* not recording: the stdlib's put */
        res = PyObject_Vectorcall(h->call, args, nargsf, kwnames);
    else if (!Py_IS_TYPE(w, &WriterType) || nargs < 2)
        res = PyObject_Vectorcall(h->slow, args, nargsf, kwnames);   /* Python Writer */
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
    .tp_name = "mpviz.trace._writer.Hook",
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

static PyMethodDef module_functions[] = {
    {"set_numbering", (PyCFunction)(void (*)(void))set_numbering_function, METH_FASTCALL,
     "set_numbering(counter, prefix): messages.py's message counter and id prefix, for the "
     "hooks; messages.py calls it whenever it makes new ones"},
    {"set_writer", set_writer_function, METH_O,
     "set_writer(w): the Writer recording now (None: none), for the hooks; recorder.py calls "
     "it whenever it changes recorder.writer"},
    {"take_feeding_msg", take_feeding_function, METH_NOARGS,
     "the id Pickler.dumps pickled last in this thread (None: none), forgotten here"},
    {"encode", (PyCFunction)(void (*)(void))encode_function, METH_FASTCALL,
     "encode(ts_ns, tid, kind, args) -> the record's bytes (for tests: compare with Python's)"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_writer", "The recorder's Writer in C (see writer.c).", -1,
    module_functions,
};

PyMODINIT_FUNC
PyInit__writer(void)
{
    PyTypeObject *types[] = {&WriterType, &TapType, &TagType, &PicklerType, &HookType};
    const char *type_names[] = {"Writer", "Tap", "Tag", "Pickler", "Hook"};
    for (int i = 0; i < 5; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    const char *words[] = {"queue", "msg", "nbytes", "sig", "emit_at", "name", "mark",
                           "_mpviz_qid", "_thread", "_mpviz_hooked_feeder", "_recv_bytes", "obj",
                           "queue.put", "_handle"};
    PyObject **interned[] = {&QUEUE, &MSG, &NBYTES, &SIG, &EMIT_AT, &NAME, &MARK, &QID, &THREAD,
                             &HOOKED_FEEDER, &RECV_BYTES, &OBJ, &PUT_KIND, &HANDLE};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (*interned[i] == NULL && (*interned[i] = PyUnicode_InternFromString(words[i])) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    for (int i = 0; i < 5; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, type_names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    pthread_atfork(NULL, NULL, forget_tid_in_child);
    return m;
}
