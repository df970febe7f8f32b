/* atomic.c -- one atomic add on a shared count, as one cheap compiled Python function.

sharing/segment.py's ``choose_atomic_add`` has the reference (the ctypes add) and says which add a
process uses: read it first. Both strategies keep a
count in the first 8 bytes of every shared segment (how many processes map it, plus the handles
on their way), and every handle that travels changes it twice: +1 when it is pickled, -1 when it
arrives where the segment is mapped already. Those adds must be atomic *across processes*: two
processes adding at the same moment must both be counted. One CPU instruction on the shared page
does that (``lock xadd`` on x86), the instruction torch's ``RefcountedMapAllocator`` uses.

Python has no such instruction. ``ctypes`` can call libatomic's ``__atomic_fetch_add_8``, but a
ctypes call converts every argument and builds a C call frame at run time, four times per
round trip (what that costs: docs/PERFORMANCE.md). This function does the same in one compiled
call:

    add(buffer, delta) -> the new count
        buffer  anything writable with the buffer protocol, at least 8 bytes, aligned to 8
                (a segment's mapping: its start is page-aligned)
        delta   added atomically; 0 reads the count

mpviz/_native.py builds it on first use, as it builds the recorder's C Writer; without a
compiler, ``atomic_add`` keeps using ctypes.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Across processes the add must be one instruction: an add that is not lock-free takes a lock
   inside this process, which the others never see. Where that is so, refuse to build (the count
   then falls back to ctypes, which checks the same at run time, and then to an fcntl lock). */
_Static_assert(__atomic_always_lock_free(sizeof(int64_t), 0),
               "8-byte atomics are not lock-free on this machine");

static PyObject *
add(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(buffer, delta) takes 2 arguments");
        return NULL;
    }
    long long delta = PyLong_AsLongLong(args[1]);
    if (delta == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (view.len < 8 || ((uintptr_t)view.buf % 8) != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError,
                        "add() needs a writable buffer of at least 8 bytes, aligned to 8");
        return NULL;
    }
    int64_t count = __atomic_add_fetch((int64_t *)view.buf, (int64_t)delta, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(count);
}

static PyMethodDef methods[] = {
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL,
     "add(buffer, delta) -> new count: an atomic add on the 8-byte count at the buffer's start."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_atomic", "An atomic add on a shared count (see atomic.c).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__atomic(void)
{
    return PyModule_Create(&module);
}
