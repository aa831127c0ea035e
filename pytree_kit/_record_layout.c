/* _record_layout.c: a record's fields as indexes into its class's shared
 * keys, the codes that the fast paths instance_values (3.11) and
 * split_values read with.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Compiled where either path is (LAYOUT_311 ||
 * SPLIT_READS); layout_field_codes is a no-op elsewhere.
 *   layout_field_codes  a class's field codes: -1 - the name's index in its
 *                       shared keys (_class_plans.c's record_reads calls it)
 *   reads_of            a FieldReads from its bytes object
 *   shares_keys, probe_reads  for the fast paths' import-time checks
 * Calls: only the C API and _core.h.
 */

#include "_core.h"

/* ------------------------------------------------------------------------ */
/* Reading a record's fields without PyObject_GetAttr
 *
 * For an instance of a class with CPython's generic attribute lookup,
 * getattr(obj, name) is decided by what the class (with its bases) binds the
 * name to:
 *  - a slot (a member descriptor of T_OBJECT_EX): the pointer at the slot's
 *    offset in the instance;
 *  - nothing, or a non-data descriptor whose type is immutable (a default
 *    value such as 0 or None, a function): the instance's own value when it
 *    has one. On CPython 3.11 that value sits in the instance's inline values
 *    array, at the name's index in the class's shared keys.
 * A class's reads are worked out with its plan, so they follow the class's
 * version tag like the plan does: one code per field, 0 for PyObject_GetAttr,
 * > 0 for a slot's offset, < 0 for -1 - the index in the shared keys. A read
 * that finds nothing (an unset slot, no value, values moved to a dict) goes to
 * PyObject_GetAttr, which gives the class's default, the AttributeError or
 * whatever else CPython would. The fast reads run no user code. */

#if LAYOUT_311 || SPLIT_READS

/* Whether the instances of class t (a heap class) keep their attributes
 * against its shared keys: from 3.11 a class with a managed dict (3.11: inline
 * values, then a split __dict__); on 3.10, which has no managed dicts, one
 * whose instances have a __dict__ */
PK_SHARED_INLINE int
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

/* The layout reads of a record class's fields (3.11's inline values, and
 * split __dict__ values, where those fast paths are on): for each field r
 * reads from the instance's __dict__ (READS_DICT_OK) with no slot, its index
 * in t's shared keys, as code -1 - index, when the keys hold its name. r was
 * made from the class's plan (_class_plans.c's record_reads), so these follow
 * the class's version tag as the plan does. No code runs. */
PK_SHARED void
layout_field_codes(PyTypeObject *t, PyObject *names, FieldReads *r)
{
#if LAYOUT_311 || SPLIT_READS
    /* (on 3.11 the split reads take these codes too, and their check needs
     * values_reads_ok: split_values also asks for split_reads_ok) */
    if (!((LAYOUT_311 ? values_reads_ok : split_reads_ok) && shares_keys(t) &&
          PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE))) {
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

#if LAYOUT_311 || SPLIT_READS
/* The reads of a class made by a fast path's check, whose fields (names, exact
 * strs) the class binds to nothing: as _class_plans.c's record_reads makes
 * them for such a class. A bytes object (reads_of), or NULL. */
PK_SHARED PyObject *
probe_reads(PyTypeObject *t, PyObject *names)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *b = PyBytes_FromStringAndSize(
        NULL, offsetof(FieldReads, code) + (2 * n + 1) * sizeof(Py_ssize_t));
    if (b == NULL) {
        return NULL;
    }
    FieldReads *r = (FieldReads *)PyBytes_AS_STRING(b);
    r->keys = NULL;
    r->has_dict = t->tp_dictoffset != 0;
    r->n = n;
    r->n_values = 0;
    r->n_slots = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        r->code[i] = 0;
        READS_DICT_OK(r, i) = 1;
    }
    layout_field_codes(t, names, r);
    return b;
}
#endif

PK_SHARED_INLINE const FieldReads *
reads_of(PyObject *reads_obj)
{
    return reads_obj == NULL ? NULL : (const FieldReads *)PyBytes_AS_STRING(reads_obj);
}
