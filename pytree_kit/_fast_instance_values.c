/* _fast_instance_values.c: the fast path instance_values, a record's field
 * read on CPython 3.11 from the instance's inline values array at the name's
 * index in the class's shared keys.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: LAYOUT_311 (_core.h: 3.11 alone, GIL
 * builds). Checked on import by values_reads_check, which sets
 * values_reads_ok; off, such a field is read with getattr. What it buys over
 * the portable core (benchmarks/fast_paths.py): FIGURE_instance_values.
 * The read itself is _classify.c's record_read (VALUES_OF, _layouts.h).
 *   values_reads_check  the import-time check
 * Calls: only the C API and _core.h (_record_layout.c's codes).
 */

#include "_core.h"

/* set on import by values_reads_check, where compiled */
PK_DATA int values_reads_ok;

#if LAYOUT_311
/* getattr(obj, name) for field i of a record whose class's reads are r (or
 * NULL), when its slot or (3.11) inline value holds it: a new reference;
 * else NULL, with no error set and no code run. */
static inline PyObject *
field_read_fast(PyObject *obj, const FieldReads *r, Py_ssize_t i)
{
    if (r != NULL) {
        Py_ssize_t code = r->code[i];
        PyObject *v = NULL;
        if (code > 0) {
            v = SLOT(obj, code);
        }
        else if (code < 0) {
            PyObject **values = VALUES_OF(obj);
            if (values != NULL && (void *)SHARED_KEYS(Py_TYPE(obj)) == r->keys) {
                v = values[-1 - code];
            }
        }
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return NULL;
}

/* getattr(obj, name) for field i of a record whose class's reads are r (or
 * NULL): a new reference, or NULL with the error set. */
static inline PyObject *
field_read(PyObject *obj, const FieldReads *r, Py_ssize_t i, PyObject *name)
{
    PyObject *v = field_read_fast(obj, r, i);
    return v != NULL ? v : PyObject_GetAttr(obj, name);
}

/* Sets values_reads_ok when CPython lays instance values out as field_read
 * expects: reads of a class made here must agree with PyObject_GetAttr, before
 * and after a value is deleted. A failure of any kind just leaves it off. */
PK_SHARED void
values_reads_check(void)
{
    PyObject *cls = NULL, *obj = NULL, *names = NULL, *reads = NULL, *vals[3] = {0};
    int ok = 0;
    values_reads_ok = 1;
    cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_Probe");
    obj = cls ? PyObject_CallNoArgs(cls) : NULL;
    names = Py_BuildValue("(sss)", "first", "second", "third");
    if (obj == NULL || names == NULL || !shares_keys((PyTypeObject *)cls)) {
        goto done;
    }
    for (int i = 2; i >= 0; i--) { /* set in another order than read */
        if ((vals[i] = PyList_New(0)) == NULL ||
            PyObject_SetAttr(obj, PyTuple_GET_ITEM(names, i), vals[i]) < 0) {
            goto done;
        }
    }
    reads = probe_reads((PyTypeObject *)cls, names);
    if (reads == NULL) {
        goto done;
    }
    const FieldReads *r = reads_of(reads);
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *v = r->code[i] < 0 ? field_read(obj, r, i, PyTuple_GET_ITEM(names, i)) : NULL;
        Py_XDECREF(v);
        if (v != vals[i]) {
            goto done;
        }
    }
    if (PyObject_DelAttr(obj, PyTuple_GET_ITEM(names, 1)) < 0) {
        goto done;
    }
    PyObject *gone = field_read(obj, r, 1, PyTuple_GET_ITEM(names, 1));
    if (gone != NULL) {
        Py_DECREF(gone);
        goto done;
    }
    ok = PyErr_ExceptionMatches(PyExc_AttributeError);
done:
    PyErr_Clear();
    values_reads_ok = ok;
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(vals[i]);
    }
    Py_XDECREF(reads);
    Py_XDECREF(names);
    Py_XDECREF(obj);
    Py_XDECREF(cls);
}

#endif
