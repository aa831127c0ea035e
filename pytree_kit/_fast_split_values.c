/* _fast_split_values.c: the fast path split_values, a record's field read
 * from its __dict__'s split values at the name's index in the class's shared
 * keys.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: SPLIT_READS (_core.h: 3.10 to 3.15, GIL
 * builds). Checked on import by split_reads_check, which sets
 * split_reads_ok; off, the name is looked up in the __dict__
 * (PyDict_GetItemWithError). What it buys over the portable core
 * (benchmarks/fast_paths.py): up to 1.49x on 3.13.0
 * (a dataclass batch of 512, flatten_up_to), 1.28x on 3.14.10 and 1.29x on
 * 3.15.2 (of 64); on 3.11.7 1.03x, measured while 3.11's inline values had
 * a path of their own (instance_values, since gone).
 *   layout_field_codes  a class's field codes: -1 - the name's index in its
 *                       shared keys (_class_plans.c's record_reads calls it;
 *                       a no-op where the path is not compiled)
 *   split_values, split_key_is  the values, and whether an index is a name's
 *   split_reads_check           the import-time check
 * Callers: _classify.c's record reads, _class_plans.c.
 * Calls: _class_plans.c (record_reads).
 */

#include "_core.h"

/* set on import by split_reads_check, where compiled */
PK_DATA int split_reads_ok;

/* Reading a record's fields without PyObject_GetAttr
 *
 * For an instance of a class with CPython's generic attribute lookup,
 * getattr(obj, name) is decided by what the class (with its bases) binds the
 * name to:
 *  - a slot (a member descriptor of T_OBJECT_EX): the pointer at the slot's
 *    offset in the instance;
 *  - nothing, or a non-data descriptor whose type is immutable (a default
 *    value such as 0 or None, a function): the instance's own value when it
 *    has one, which a split __dict__ keeps at the name's index in the class's
 *    shared keys.
 * A class's reads are worked out with its plan, so they follow the class's
 * version tag like the plan does: one code per field, 0 for PyObject_GetAttr,
 * > 0 for a slot's offset, < 0 for -1 - the index in the shared keys. A read
 * that finds nothing (an unset slot, no value, a __dict__ no longer split) goes to
 * PyObject_GetAttr, which gives the class's default, the AttributeError or
 * whatever else CPython would. The fast reads run no user code. */

#if SPLIT_READS

/* Whether the instances of class t (a heap class) keep their attributes
 * against its shared keys: from 3.11 a class with a managed dict; on 3.10,
 * which has no managed dicts, one whose instances have a __dict__ */
static inline int
shares_keys(PyTypeObject *t)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyType_HasFeature(t, Py_TPFLAGS_MANAGED_DICT);
#else
    return t->tp_dictoffset != 0;
#endif
}


/* The index of name among a class's shared keys, or -1. */
static Py_ssize_t
shared_key_index(DictKeys *k, PyObject *name)
{
    if (k == NULL) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030B0000
    if (k->dk_kind == 0 /* DICT_KEYS_GENERAL */) {
        return -1;
    }
#endif
    for (Py_ssize_t i = 0; i < k->dk_nentries; i++) {
        PyObject *key = SHARED_KEY(k, i);
        if (key == name) {
            return i;
        }
        if (key != NULL && PyUnicode_CheckExact(key)) {
            int eq = PyUnicode_Compare(key, name);
            if (eq == 0) {
                return i;
            }
        }
    }
    return -1;
}
#endif

/* The layout reads of a record class's fields (split __dict__ values, where
 * this fast path is on): for each field r
 * reads from the instance's __dict__ (READS_DICT_OK) with no slot, its index
 * in t's shared keys, as code -1 - index, when the keys hold its name. r was
 * made from the class's plan (_class_plans.c's record_reads), so these follow
 * the class's version tag as the plan does. No code runs. */
PK_SHARED void
layout_field_codes(PyTypeObject *t, PyObject *names, FieldReads *r)
{
#if SPLIT_READS
    if (!(split_reads_ok && shares_keys(t) && PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE))) {
        return;
    }
    r->keys = SHARED_KEYS(t);
    for (Py_ssize_t i = 0; i < r->n; i++) {
        if (r->code[i] == 0 && READS_DICT_OK(r, i)) {
            Py_ssize_t ix = shared_key_index(r->keys, PyTuple_GET_ITEM(names, i));
            if (ix >= 0) {
                r->code[i] = -1 - ix;
                r->n_values++;
            }
        }
    }
#else
    (void)t;
    (void)names;
    (void)r;
#endif
}

#if SPLIT_READS
/* The reads of a class made by the check below, whose fields (names, exact
 * strs) the class binds to nothing: _class_plans.c's record_reads for them,
 * each read from the instance __dict__. A bytes object (reads_of), or NULL. */
static PyObject *
probe_reads(PyTypeObject *t, PyObject *names)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *reads = PyTuple_New(n), *none = PyTuple_New(0), *b = NULL;
    if (reads != NULL && none != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTuple_SET_ITEM(reads, i, Py_NewRef(Py_True));
        }
        b = record_reads(t, names, reads, none);
    }
    Py_XDECREF(reads);
    Py_XDECREF(none);
    return b;
}
#endif


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
