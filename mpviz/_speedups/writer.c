/* writer.c -- the recorder's Writer in C: the same records as trace/recorder.py's Writer, faster.

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

The per-message Queue hooks are in queue_hooks.c, which this file includes (one module, two files).
At the end, read_records: reader.py's loop over a window of good records, for the reader.

Built and loaded on first use by trace/native.py (see mpviz/_speedups); when it cannot be built, the Python Writer is used.
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
#include <poll.h>
#include <limits.h>

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

/* Where the Python Writer's time goes (the figures: docs/PERFORMANCE.md), and what this file does:

       marshal.dumps(args, 2)   a general serializer             str/int/float/bool/None are written
                                                                 here in marshal's own layout (the
                                                                 reader's marshal.loads reads them);
                                                                 anything else is handed to marshal
       a Python lock                                             no lock: see below
       clock, thread id, the    a Python call each               C calls; the thread id cached
       checksum, struct.pack */

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
       a it started with plus its bytes weighted 16, 15, ..., 1. The rest one byte at a time.
       Worth it even for a typical record's ~100 bytes: 232 instructions against 469 for the
       4-bytes-a-step loop below (valgrind), ~80 against ~180 ns here -- a quarter of what
       writing a small event costs. */
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

/* Steps 3 and 4. Returns 0 when written (or dropped because recording stopped), -1 on error.

   The GIL is the lock. Step 3 is plain C: it calls no Python code, so no other thread can run
   between finding room for a record and committing it. The one call out to Python, on_full() in
   step 4, happens with the chunk sealed: the threads that run meanwhile find no room either, and
   wait in on_full() for the one new chunk. */
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

/* Every failure of the Writer (an argument marshal cannot encode, a full disk while mapping a
   new chunk) is passed to on_error(kind, exception) instead of being raised: a recorder must
   never break the program it observes. (The recorder's own on_error warns and stops recording;
   a test's SideLog raises.) Tap goes further: whatever fails while it records, the message it
   carries goes through. The one exception to both: what is not an Exception (KeyboardInterrupt,
   SystemExit) goes up to the caller, as from the Python Writer and hooks -- a Ctrl-C stops the
   program, not only its recording (and a message a Tap had read then is lost with the get it
   belonged to). */

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

/* A Queue event: {"queue": queue, ["msg": msg,] ["nbytes": n, "sig": sig,] ["handles": h]} --
   the dict messages.py builds, written straight into the record (a dict costs more than the rest
   of the event). With `data`: its size and sig, the Adler-32 of its last 32 bytes (recorder.sig);
   `handles` (> 0: the handles pickling the message made, as messages.carried adds them). */
static PyObject *QUEUE, *MSG, *NBYTES, *SIG, *EMIT_AT, *HANDLE, *HANDLES;   /* interned strs */

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
                  const Py_buffer *data, long handles)
{
    Buf b;
    buf_init(&b);
    /* the keys as put_str writes them: 'u', a u32 length, the characters (and '{' first) */
    static const char open_queue[] = "{u\5\0\0\0queue", key_msg[] = "u\3\0\0\0msg";
    static const char key_nbytes[] = "u\6\0\0\0nbytes", key_sig[] = "u\3\0\0\0sig";
    static const char key_handles[] = "u\7\0\0\0handles";
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
    if (r == 0 && handles > 0)
        r = put_bytes(&b, key_handles, sizeof key_handles - 1) || put_llong(&b, handles);
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
    PyObject *res = write_queue_event(w, ts, argv[1], argv[2], argv[3], &data, 0);
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
    .tp_name = "mpviz._speedups._writer.Writer",
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

/* The per-message Queue hooks (Tap, Tag, Pickler, Hook) and the Queue waits: their own file,
   compiled as part of this one (they use the Writer above directly). */
#include "queue_hooks.c"

/* --- reading records back: reader.py's loop over a window, in C -----------------------------

   read_records(buf, rel, pid, out, waits, wait_kinds) -> the offset in buf after the last
   record read. From buf[rel:] on, each whole record whose checksum holds and whose body decodes
   becomes (ts_ns, pid, tid, kind, args) in `out` -- or, if its kind is in the set wait_kinds
   (reader._WAIT_KINDS: one place decides, for both readers), is handed to
   waits(out, ts, pid, tid, kind, args). It stops at the first record it cannot take as it
   is: a length of 0 or PAD, a record that runs past buf, a checksum that does not match, a
   body that does not decode. reader.py's own loop then looks at that record (and says what is
   wrong with it): this only takes the common case off its hands, with the same checks
   (the checksum: adler32 above, as zlib's; the args: marshal, as marshal.loads). */
static PyObject *
read_records_function(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 6 || !PyList_Check(argv[3]) || !PyAnySet_Check(argv[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_records(buf, rel, pid, out: list, waits, wait_kinds: set)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t rel = PyLong_AsSsize_t(argv[1]);
    PyObject *pid = argv[2], *out = argv[3], *waits = argv[4], *wait_kinds = argv[5];
    const unsigned char *p = view.buf;
    Py_ssize_t len = view.len;
    if (rel == -1 && PyErr_Occurred())
        goto fail;
    while (rel >= 0 && rel + RECORD_HEADER <= len) {
        uint32_t n, check;
        uint64_t ts, tid;
        memcpy(&n, p + rel, 4);
        memcpy(&check, p + rel + 4, 4);
        if (n == 0 || n == PAD || n < BODY_HEADER || (Py_ssize_t)n > len - rel - RECORD_HEADER)
            break;
        const unsigned char *body = p + rel + RECORD_HEADER;
        if (adler32(body, n) != check)
            break;
        unsigned k = body[16];
        if (BODY_HEADER + k > n)
            break;
        memcpy(&ts, body, 8);
        memcpy(&tid, body + 8, 8);
        PyObject *kind = PyUnicode_DecodeUTF8((const char *)body + BODY_HEADER, k, NULL);
        if (kind == NULL) {
            PyErr_Clear();
            break;
        }
        PyUnicode_InternInPlace(&kind);
        PyObject *args = PyMarshal_ReadObjectFromString((const char *)body + BODY_HEADER + k,
                                                        n - BODY_HEADER - k);
        if (args == NULL) {
            PyErr_Clear();                   /* reader.py's loop says what is wrong with it */
            Py_DECREF(kind);
            break;
        }
        PyObject *ts_obj = PyLong_FromUnsignedLongLong(ts);
        PyObject *tid_obj = PyLong_FromUnsignedLongLong(tid);
        int failed = ts_obj == NULL || tid_obj == NULL;
        int follow = failed ? 0 : PySet_Contains(wait_kinds, kind);
        failed = failed || follow < 0;
        if (!failed && follow) {
            PyObject *r = PyObject_CallFunctionObjArgs(waits, out, ts_obj, pid, tid_obj, kind,
                                                       args, NULL);
            failed = r == NULL;
            Py_XDECREF(r);
        } else if (!failed) {
            PyObject *event = PyTuple_Pack(5, ts_obj, pid, tid_obj, kind, args);
            failed = event == NULL || PyList_Append(out, event) < 0;
            Py_XDECREF(event);
        }
        Py_XDECREF(ts_obj);
        Py_XDECREF(tid_obj);
        Py_DECREF(kind);
        Py_DECREF(args);
        if (failed)
            goto fail;
        rel += RECORD_HEADER + n;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(rel);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef module_functions[] = {
    {"get_would_wait", get_would_wait_function, METH_O,
     "get_would_wait(q): whether q.get() would wait now (messages.get_would_wait in C)"},
    {"waiting_get", (PyCFunction)(void (*)(void))waiting_get_function, METH_FASTCALL,
     "waiting_get(timeout, get, q, *more): get(q, *more) recorded as a wait, ended by its "
     "queue.get (messages.waiting_get in C)"},
    {"got", got_function, METH_O,
     "got(qid): this thread just recorded a queue.get on qid, which ends its get's wait on qid "
     "if one is open (waits.got in C)"},
    {"outermost", outermost_function, METH_NOARGS,
     "outermost(): recording, and this thread not inside a recorded wait (waits._outermost in C)"},
    {"not_in_a_wait", not_in_a_wait_function, METH_NOARGS,
     "not_in_a_wait(): this thread not inside a recorded wait (messages._not_in_a_wait in C)"},
    {"set_in_wait", set_in_wait_function, METH_O,
     "set_in_wait(local): waits._in_wait, the thread-local whose .on says 'inside a recorded "
     "wait' (messages.install_native passes it)"},
    {"readable", readable_function, METH_O,
     "readable(fd): whether a read of fd would return at once (poll, timeout 0): "
     "messages.readable in C"},
    {"set_numbering", (PyCFunction)(void (*)(void))set_numbering_function, METH_FASTCALL,
     "set_numbering(counter, prefix): messages.py's message counter and id prefix, for the "
     "hooks; messages.py calls it whenever it makes new ones"},
    {"set_writer", set_writer_function, METH_O,
     "set_writer(w): the Writer recording now (None: none), for the hooks; recorder.py calls "
     "it whenever it changes recorder.writer"},
    {"take_feeding_msg", take_feeding_function, METH_NOARGS,
     "the id Pickler.dumps pickled last in this thread (None: none), forgotten here"},
    {"set_feeding_handles", set_feeding_handles_function, METH_O,
     "set_feeding_handles(n): the handles the message just pickled in this thread carries, "
     "for the queue.feed of its write (messages._CountingPickler calls it)"},
    {"read_records", (PyCFunction)(void (*)(void))read_records_function, METH_FASTCALL,
     "read_records(buf, rel, pid, out, waits, wait_kinds) -> offset after the records read "
     "(reader.py's "
     "loop in C, for the records that pass every check)"},
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
                           "queue.put", "_handle", "_maxsize", "_sem", "_semlock", "_is_zero", "wait.begin", "wait.end",
                           "queue.get", "on", "id", "ok", "error", "timeout", "_reader", "handles",
                           "_rlock"};
    PyObject **interned[] = {&QUEUE, &MSG, &NBYTES, &SIG, &EMIT_AT, &NAME, &MARK, &QID, &THREAD,
                             &HOOKED_FEEDER, &RECV_BYTES, &OBJ, &PUT_KIND, &HANDLE, &MAXSIZE,
                             &SEM, &SEMLOCK, &IS_ZERO, &WAIT_BEGIN, &WAIT_END, &GET_KIND, &ON, &ID,
                             &OK, &ERROR, &TIMEOUT, &READER, &HANDLES, &RLOCK};
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
