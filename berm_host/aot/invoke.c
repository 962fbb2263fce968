/* berm_host.aot._invoke: the harness fast path (AotBackend.call_tool) as one CPython call.
 *
 * Through cffi, an invocation from Python was a cffi call of berm_run plus reading a0 and a1, slicing guest memory
 * into bytes and decoding them: about 40 bytecodes around the core, more time than the core itself takes (one
 * trivial tool: 2.3 us against 0.7 us for the C of it, measured in one process on this machine). run_text does it
 * all in one METH_FASTCALL call and builds the result str straight from guest memory.
 *
 * This module does not link the core: it calls berm_run through the pointer bind() was given, which
 * berm_host/aot/runtime.py takes from the cffi module (berm_host.aot._core) when it is imported. It includes
 * core.h only for the region's layout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as it asks */

#include "core.h"

#include <stddef.h>

typedef __typeof__(berm_run) *berm_run_fn;
static berm_run_fn run;

/* The argument checks both functions open with: `argc` is `want` (else a TypeError naming `usage`), and `arg`, an
 * address, is not NULL (else a ValueError naming `what`). Each returns 0 with the exception set. */
static int has_args(Py_ssize_t argc, Py_ssize_t want, const char *usage) {
    if (argc == want) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
    return 0;
}

static void *address_arg(PyObject *arg, const char *what) {
    void *p = PyLong_AsVoidPtr(arg);
    if (!p && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s is NULL", what);
    return p;
}

/* bind(address of berm_run, offsetof(berm_region, ctx.regs), offsetof(berm_region, ctx.mem)) as the cffi module
 * sees them: a module built against another layout of the region (setup.py rebuilds this one when core.h or
 * berm_rt.h change, but a stale build can be copied around) is refused instead of reading the wrong words. */
static PyObject *bind(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (!has_args(argc, 3, "bind(berm_run, regs offset, mem offset)")) return NULL;
    void *fn = address_arg(argv[0], "bind: berm_run's address");
    if (!fn) return NULL;
    Py_ssize_t regs = PyLong_AsSsize_t(argv[1]), mem = PyLong_AsSsize_t(argv[2]);
    if (PyErr_Occurred()) return NULL;
    if (regs != (Py_ssize_t)offsetof(berm_region, ctx.regs) || mem != (Py_ssize_t)offsetof(berm_region, ctx.mem)) {
        PyErr_Format(PyExc_ImportError,
                     "berm_host.aot._invoke was built against another runtime layout (registers at %zd, memory "
                     "pointer at %zd; the core has them at %zd and %zd): rebuild with `pip install -e .`",
                     (Py_ssize_t)offsetof(berm_region, ctx.regs), (Py_ssize_t)offsetof(berm_region, ctx.mem), regs,
                     mem);
        return NULL;
    }
    run = (berm_run_fn)fn;
    Py_RETURN_NONE;
}

/* run_text(region address, entry, args bytes, timeout) -> the result str, or the berm_run outcome (an int) when
 * the run did not end in a plain BERM_RUN_OK or its result is not UTF-8: the caller then reads what it needs from
 * the region. The GIL is released while the guest runs, as a cffi call releases it. */
static PyObject *run_text(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (!has_args(argc, 4, "run_text(region, entry, args, timeout)")) return NULL;
    if (!run) {
        PyErr_SetString(PyExc_RuntimeError, "run_text: bind() was not called");
        return NULL;
    }
    berm_region *r = address_arg(argv[0], "run_text: the region");
    if (!r) return NULL;
    uint64_t entry = PyLong_AsUnsignedLongLong(argv[1]);
    if (entry == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    char *args;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(argv[2], &args, &n) < 0) return NULL;
    double timeout = PyFloat_AsDouble(argv[3]);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    int outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = run(r, entry, args, (uint64_t)n, 0, timeout);
    Py_END_ALLOW_THREADS
    if (outcome == BERM_RUN_OK) {
        /* berm_run checked that (a0, a1) is readable guest memory within the result cap, or empty (anywhere) */
        const berm_ctx *c = &r->ctx;
        if (!c->regs[11]) return PyUnicode_New(0, 0);
        PyObject *text = PyUnicode_DecodeUTF8((const char *)c->mem + c->regs[10], (Py_ssize_t)c->regs[11], NULL);
        if (text) return text;
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL; /* out of memory */
        PyErr_Clear();
    }
    return PyLong_FromLong(outcome);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(address, regs offset, mem offset): the berm_run that run_text calls, and the layout it expects"},
    {"run_text", (PyCFunction)(void (*)(void))run_text, METH_FASTCALL,
     "run_text(region, entry, args, timeout) -> str | int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_invoke", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__invoke(void) { return PyModule_Create(&module); }
