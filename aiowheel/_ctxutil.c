/* aiowheel._ctxutil: whether the current context holds the very variables of a
 * snapshot, asked without copying the current context.
 *
 * A new handle shares the last context snapshot while the current context holds the
 * same variables (aiowheel/_handle.py, snapshot_context; docs/design.md, "Context
 * snapshots"). Python can only ask that by copying the current context
 * (contextvars.copy_context, one object made and freed per handle) and comparing the
 * two. A Context's variables are an immutable mapping (CPython's HAMT), which a copy
 * shares and every ContextVar.set replaces: so the current context holds the
 * snapshot's variables when it holds the same mapping object. The snapshot keeps its
 * mapping alive, so no other mapping can have that address meanwhile.
 *
 * The mapping is a field of CPython's context object that no API exposes
 * (Include/internal/pycore_context.h: the same layout in 3.11, 3.12 and 3.13, the
 * versions the project supports). Its place is
 * checked when the module is imported; if the check fails, holds_current() always
 * answers False and every handle takes the copy, as without this module. It
 * allocates nothing and runs no Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* The head of CPython's PyContext, up to the field read here. */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars; /* the variables: an immutable HAMT */
} ContextHead;

#define VARS(context) (((ContextHead *)(context))->ctx_vars)

/* Whether the layout above is CPython's (checked once, at import). */
static int layout_known = 0;

static PyObject *
ctxutil_holds_current(PyObject *module, PyObject *snapshot)
{
    if (layout_known && PyContext_CheckExact(snapshot)) {
        /* NULL until the thread's first context is made: no share then. */
        PyObject *current = PyThreadState_Get()->context;
        if (current != NULL && VARS(current) == VARS(snapshot)) {
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

/* Two copies of the current context share its mapping, a HAMT, and the thread's
 * current context is then set: if the field read above is that mapping, in all
 * three, the layout is the one this module was written for. */
static int
check_layout(void)
{
    int known = 0;
    PyObject *first = PyContext_CopyCurrent();
    PyObject *second = first == NULL ? NULL : PyContext_CopyCurrent();
    if (second != NULL) {
        PyObject *vars = VARS(first);
        PyObject *current = PyThreadState_Get()->context;
        known = vars != NULL && VARS(second) == vars && current != NULL &&
                PyContext_CheckExact(current) && VARS(current) == vars &&
                strcmp(Py_TYPE(vars)->tp_name, "hamt") == 0;
    }
    Py_XDECREF(first);
    Py_XDECREF(second);
    PyErr_Clear();
    return known;
}

static PyObject *
ctxutil_layout_known(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(layout_known);
}

static PyMethodDef ctxutil_methods[] = {
    {"holds_current", ctxutil_holds_current, METH_O,
     "holds_current(snapshot, /)\n--\n\nWhether the current context holds the very "
     "variables of snapshot (a Context): the same mapping object."},
    {"layout_known", ctxutil_layout_known, METH_NOARGS,
     "layout_known()\n--\n\nWhether holds_current can answer True: the layout of "
     "CPython's context object was recognised at import."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ctxutil_module = {
    PyModuleDef_HEAD_INIT,
    "aiowheel._ctxutil",
    "Whether the current context holds a snapshot's variables, without copying it "
    "(the compiled core's context snapshots; aiowheel/_handle.py).",
    0,
    ctxutil_methods,
};

PyMODINIT_FUNC
PyInit__ctxutil(void)
{
    PyObject *module = PyModule_Create(&ctxutil_module);
    if (module != NULL) {
        layout_known = check_layout();
    }
    return module;
}
