/*
 * inferprobe USDT probes for Python: one <sys/sdt.h> probe per row of the
 * contract in docs/usdt-probes.md, provider "inferprobe".
 *
 * Every probe has a USDT semaphore. A tracer (bcc, bpftrace, perf) increments
 * it while attached, so the untraced path of each function is an arity check
 * and one load-and-branch on the semaphore: argument conversion happens only
 * when someone is listening.
 *
 * The probe list here is checked against inferprobe/probes/__init__.py (the
 * one Python source of names and argument order) by tests/unit/probes, reading
 * this module's .note.stapsdt, and tests/integration/probes, firing every probe
 * under bcc.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Must precede <sys/sdt.h>: makes each note carry its semaphore's address. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#include <stdint.h>

/* name, number of arguments. Names are also the Python function names. */
#define INFERPROBE_PROBES(X)   \
    X(request_start, 3)        \
    X(request_queued, 2)       \
    X(request_scheduled, 2)    \
    X(prefill_start, 2)        \
    X(prefill_end, 2)          \
    X(decode_step_start, 3)    \
    X(decode_step_end, 3)      \
    X(token_emit, 2)           \
    X(request_end, 3)          \
    X(queue_depth, 2)          \
    X(kv_usage, 2)

/*
 * sys/sdt.h names a probe's semaphore <provider>_<name>_semaphore. It lives in
 * ".probes" (a file-backed, writable section) so tracers can find and bump it;
 * hidden, so a host program that also defines inferprobe semaphores (through
 * inferprobe/usdt.h, exported with -rdynamic) cannot interpose on ours: each
 * object's notes point at its own counters.
 */
#define DEFINE_SEMAPHORE(name, nargs)                                          \
    __attribute__((section(".probes"), visibility("hidden"), used))            \
    volatile unsigned short inferprobe_##name##_semaphore = 0;
INFERPROBE_PROBES(DEFINE_SEMAPHORE)

/* Calls skipped while traced because an argument was not an int64. */
static uint64_t skipped_calls = 0;

static PyObject *
wrong_arity(const char *name, Py_ssize_t want, Py_ssize_t got)
{
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd positional arguments (%zd given)",
                 name, want, got);
    return NULL;
}

/*
 * Converts args to int64. On failure the call is skipped, not raised: the
 * failure can only happen while a tracer is attached, and attaching a tracer
 * must never make a server raise where it did not before.
 */
static int
read_args(PyObject *const *args, int n, long long *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            skipped_calls++;
            return 0;
        }
    }
    return 1;
}

#define FIRE_2(name, v) STAP_PROBE2(inferprobe, name, v[0], v[1])
#define FIRE_3(name, v) STAP_PROBE3(inferprobe, name, v[0], v[1], v[2])

/*
 * The traced path is its own cold, non-inlined function so the untraced path
 * keeps no stack frame, no stack protector and no spills: arity compare,
 * semaphore load, branch, return None.
 *
 * The arity check stays on the untraced path on purpose: a wrong call must
 * fail the same way in development as in production, not only once a tracer
 * attaches. It compares a register, next to free.
 */
#define DEFINE_PROBE_FUNCTION(name, nargs)                                     \
    __attribute__((noinline, cold)) static void                                \
    fire_##name(PyObject *const *args)                                         \
    {                                                                          \
        long long v[nargs];                                                    \
        if (read_args(args, nargs, v))                                         \
            FIRE_##nargs(name, v);                                             \
    }                                                                          \
    static PyObject *                                                          \
    probe_##name(PyObject *Py_UNUSED(module), PyObject *const *args,           \
                 Py_ssize_t n)                                                 \
    {                                                                          \
        if (__builtin_expect(n != nargs, 0))                                   \
            return wrong_arity(#name, nargs, n);                               \
        if (__builtin_expect(inferprobe_##name##_semaphore != 0, 0))          \
            fire_##name(args);                                                 \
        Py_RETURN_NONE;                                                        \
    }
INFERPROBE_PROBES(DEFINE_PROBE_FUNCTION)

static int
any_enabled(void)
{
#define OR_SEMAPHORE(name, nargs) | inferprobe_##name##_semaphore
    return (0 INFERPROBE_PROBES(OR_SEMAPHORE)) != 0;
#undef OR_SEMAPHORE
}

/* METH_O so it can serve directly as a property getter (it gets the module). */
static PyObject *
enabled_getter(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(owner))
{
    return PyBool_FromLong(any_enabled());
}

static PyObject *
enabled(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(any_enabled());
}

static PyObject *
semaphores(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
#define ADD_SEMAPHORE(name, nargs)                                             \
    {                                                                          \
        PyObject *v = PyLong_FromLong(inferprobe_##name##_semaphore);          \
        if (v == NULL || PyDict_SetItemString(d, #name, v) < 0) {              \
            Py_XDECREF(v);                                                     \
            Py_DECREF(d);                                                      \
            return NULL;                                                       \
        }                                                                      \
        Py_DECREF(v);                                                          \
    }
    INFERPROBE_PROBES(ADD_SEMAPHORE)
#undef ADD_SEMAPHORE
    return d;
}

static PyObject *
get_skipped_calls(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromUnsignedLongLong(skipped_calls);
}

#define METHOD_ENTRY(name, nargs)                                              \
    {#name, (PyCFunction)(void (*)(void))probe_##name, METH_FASTCALL,          \
     "Fire inferprobe:" #name " (" #nargs " int64 arguments) if traced."},

static PyMethodDef methods[] = {
    INFERPROBE_PROBES(METHOD_ENTRY)
    {"enabled", enabled, METH_NOARGS,
     "True while a tracer is attached to any inferprobe probe (read live)."},
    {"_enabled_getter", enabled_getter, METH_O,
     "enabled() for use as a property getter: ignores its argument."},
    {"semaphores", semaphores, METH_NOARGS,
     "Current semaphore count of every probe, by name."},
    {"skipped_calls", get_skipped_calls, METH_NOARGS,
     "Calls made while traced whose arguments were not all int64 (not fired)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferprobe.probes._usdt",
    .m_doc = "USDT probes (provider inferprobe); use inferprobe.probes.usdt instead.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__usdt(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* (name, nargs) pairs, so the Python side can refuse a stale build. */
#define COUNT(name, nargs) + 1
    PyObject *table = PyTuple_New(0 INFERPROBE_PROBES(COUNT));
#undef COUNT
    if (table == NULL)
        goto fail;
    Py_ssize_t i = 0;
#define ADD_ROW(name, nargs)                                                   \
    {                                                                          \
        PyObject *row = Py_BuildValue("(si)", #name, nargs);                   \
        if (row == NULL) {                                                     \
            Py_DECREF(table);                                                  \
            goto fail;                                                         \
        }                                                                      \
        PyTuple_SET_ITEM(table, i++, row);                                     \
    }
    INFERPROBE_PROBES(ADD_ROW)
#undef ADD_ROW
    if (PyModule_AddObject(m, "PROBES", table) < 0) {
        Py_DECREF(table);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
