/* aiowheel._gcutil: take an object out of the cyclic garbage collector's lists, and
 * put it back.
 *
 * The compiled core hides a pending timer's handle from the collector while the handle
 * is linked in a wheel, and shows it again once it leaves (aiowheel/_wheel.py, "The
 * collector's ledger"; docs/design.md, "Pending timers and the garbage collector").
 * Python has no API for that, so these two functions are all this module is. Both
 * are idempotent: CPython aborts when an object that is tracked is tracked again, so
 * each tests first. Neither allocates (so neither can start a collection), and
 * neither runs Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
gcutil_untrack(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

static PyObject *
gcutil_track(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

static PyMethodDef gcutil_methods[] = {
    {"untrack", gcutil_untrack, METH_O,
     "untrack(obj, /)\n--\n\nTake obj out of the collector's lists (if it is in them)."},
    {"track", gcutil_track, METH_O,
     "track(obj, /)\n--\n\nPut obj back in the collector's lists (if it is not in them)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gcutil_module = {
    PyModuleDef_HEAD_INIT,
    "aiowheel._gcutil",
    "Untrack and track an object for the cyclic garbage collector (the compiled core's "
    "pending handles; aiowheel/_wheel.py).",
    0,
    gcutil_methods,
};

PyMODINIT_FUNC
PyInit__gcutil(void)
{
    return PyModule_Create(&gcutil_module);
}
