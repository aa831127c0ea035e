/* _fast_split_values.c: the fast path split_values, a record's field read
 * from its __dict__'s split values at the name's index in the class's shared
 * keys.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: SPLIT_READS (_core.h: 3.10 to 3.15, GIL
 * builds; on 3.11 for an instance whose __dict__ was made, instance_values
 * reads the others). Checked on import by split_reads_check, which sets
 * split_reads_ok; off, the name is looked up in the __dict__
 * (PyDict_GetItemWithError). What it buys over the portable core
 * (benchmarks/fast_paths.py): FIGURE_split_values.
 *   split_values, split_key_is  the values, and whether an index is a name's
 *   split_reads_check           the import-time check
 * Callers: _classify.c's record reads.
 * Calls: only the C API and _core.h (_record_layout.c's codes).
 */

#include "_core.h"

/* set on import by split_reads_check, where compiled */
PK_DATA int split_reads_ok;

#if SPLIT_READS
/* The values of dict (an instance's __dict__) in the order of the class's
 * shared keys, when it is a split dict of the keys the reads r were made
 * with; else NULL. */
PK_SHARED_INLINE PyObject **
split_values(PyObject *dict, const FieldReads *r)
{
    PyDictObject *mp = (PyDictObject *)dict;
    if (!split_reads_ok || r->keys == NULL || !PyDict_CheckExact(dict) || mp->ma_values == NULL ||
        (void *)mp->ma_keys != r->keys) {
        return NULL;
    }
    return ((SplitValues *)mp->ma_values)->values;
}

/* Whether entry ix of the shared keys r was made with (a live table: a split
 * dict holds it) is name itself, so that split_values(...)[ix] is its value. */
PK_SHARED_INLINE int
split_key_is(const FieldReads *r, Py_ssize_t ix, PyObject *name)
{
    DictKeys *k = r->keys;
    return ix < k->dk_nentries && SHARED_KEY(k, ix) == name;
}
#endif


#if SPLIT_READS
/* Sets split_reads_ok when CPython lays split dicts out as split_values
 * expects: for a class made here, with two instances, one holding three names
 * set in another order than read and one holding only the second (3.10: the
 * third, the first its shared keys took, as a split dict there must be filled
 * in their order), each name's value read through the class's shared keys is
 * what the __dict__ gives (PyDict_GetItemWithError), NULL where it has none,
 * and the same after a value is deleted (if the dict is still split then:
 * from 3.11). A failure of any kind leaves it off. */
PK_SHARED void
split_reads_check(void)
{
    PyObject *cls = NULL, *obj[2] = {0}, *dict[2] = {0}, *names = NULL, *reads = NULL;
    PyObject *vals[3] = {0};
    int ok = 0;
    split_reads_ok = 1;
    cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_Probe");
    /* interned, as a class's attribute names are (and its shared keys hold) */
    names = Py_BuildValue("(NNN)", PyUnicode_InternFromString("first"),
                          PyUnicode_InternFromString("second"), PyUnicode_InternFromString("third"));
    const int lone = PY_VERSION_HEX >= 0x030B0000 ? 1 : 2;
    if (cls == NULL || names == NULL || !shares_keys((PyTypeObject *)cls)) {
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        if ((obj[k] = PyObject_CallNoArgs(cls)) == NULL) {
            goto done;
        }
    }
    for (int i = 2; i >= 0; i--) { /* set in another order than read */
        if ((vals[i] = PyList_New(0)) == NULL ||
            PyObject_SetAttr(obj[0], PyTuple_GET_ITEM(names, i), vals[i]) < 0) {
            goto done;
        }
    }
    if (PyObject_SetAttr(obj[1], PyTuple_GET_ITEM(names, lone), vals[lone]) < 0 ||
        (reads = probe_reads((PyTypeObject *)cls, names)) == NULL) {
        goto done;
    }
    const FieldReads *r = reads_of(reads);
    for (int round = 0; round < 2; round++) {
        if (round == 1 && PyObject_DelAttr(obj[0], PyTuple_GET_ITEM(names, 2)) < 0) {
            goto done;
        }
        for (int k = 0; k < 2; k++) {
            Py_XDECREF(dict[k]);
            if ((dict[k] = PyObject_GenericGetDict(obj[k], NULL)) == NULL) {
                goto done;
            }
            PyObject **split = split_values(dict[k], r);
            if (split == NULL && round == 0) {
                goto done; /* a fresh instance's __dict__ is split */
            }
            for (Py_ssize_t i = 0; split != NULL && i < 3; i++) {
                PyObject *name = PyTuple_GET_ITEM(names, i);
                PyObject *want = PyDict_GetItemWithError(dict[k], name);
                if ((want == NULL && PyErr_Occurred()) || r->code[i] >= 0 ||
                    !split_key_is(r, -1 - r->code[i], name) || split[-1 - r->code[i]] != want ||
                    (want != NULL && want != vals[i])) {
                    goto done;
                }
            }
        }
    }
    ok = 1;
done:
    PyErr_Clear();
    split_reads_ok = ok;
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(vals[i]);
    }
    for (int k = 0; k < 2; k++) {
        Py_XDECREF(dict[k]);
        Py_XDECREF(obj[k]);
    }
    Py_XDECREF(reads);
    Py_XDECREF(names);
    Py_XDECREF(cls);
}
#endif
