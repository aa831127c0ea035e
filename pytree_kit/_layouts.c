/* _layouts.c: every place the engine reads CPython's own layouts.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map). Each fast path here
 * is compiled only on the versions it was validated on (the gates in
 * _core.h) and checked again on import by its *_check function, which
 * _speedups.c's init calls; a check that fails leaves the path off, and the
 * callers read through the public API instead, with the same results.
 *   type_version       (3.10, 3.11) a class's version tag (_class_plans.c)
 *   layout_field_codes (3.11) a record's fields read from its inline values,
 *   field_read(_fast)  at their index in the class's shared keys
 *                      (_class_plans.c's record_reads, the checks here)
 *   split_values,      (3.12, 3.13) the same index into its __dict__'s split
 *   split_key_is       values (_classify.c's record_read)
 *   dict_table         (3.10-3.13) an exact dict's entries read in place
 *                      (3.10-3.12: a split table's, copied to split_items)
 *                      (_classify.c's dict paths, _up_to.c)
 *   small_long         a small int's value without a call (_specread.c)
 *   odict_in_dict_order  whether an OrderedDict's own order is its dict's,
 *                      from its linked list of keys (_classify.c)
 *   template_make,     (3.10-3.13) a template dict, and dicts of its keys
 *   dict_from_template made as copies of its table (_unflatten.c's dict_of)
 *   split_holder_make, (3.10-3.12) a split table of a template's str keys,
 *   dict_split         and dicts that share it (_unflatten.c's recipes)
 *   *_check            the import-time checks of each
 * Calls: only the C API and _core.h.
 */

#include "_core.h"

#if VERSION_TAGS
/* A class's version tag, or 0 when it has no valid one, on 3.10 and 3.11,
 * which give no public way to it (from 3.12 _class_plans.c asks
 * PyUnstable_Type_AssignVersionTag): CPython marks a valid tag with
 * Py_TPFLAGS_VALID_VERSION_TAG, and a lookup of the class's attributes gives
 * it one (its method cache). _class_plans.c's tags_check checks, on import,
 * that tags behave as the class memo relies on. */
PK_SHARED_INLINE unsigned int
type_version(PyTypeObject *t)
{
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0;
    }
    return t->tp_version_tag;
}
#endif

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

/* set on import by values_reads_check, dict_reads_check, dict_layout_check,
 * split_reads_check and split_tables_check, where compiled */
PK_DATA int values_reads_ok, dict_reads_ok, dict_layout_ok, split_reads_ok, split_tables_ok;

#if DICT_READS
static PyObject *split_items[SPLIT_STEP * SPLIT_READ_MAX];

#if PY_VERSION_HEX < 0x030D0000
/* dict_table of a split table (mp's, of n items, its shared table k): its
 * keys and values, in order, copied into buf (room for SPLIT_READ_MAX items,
 * SPLIT_STEP pointers apart, the first key at buf[SPLIT_STEP - 2], each value
 * after its key), when mp has a value for each key of its shared table in the
 * table's order; 1, or 0. Out of line: the combined tables' read stays small
 * where it is inlined. */
static PK_NO_INLINE int
dict_split_items(PyDictObject *mp, DictKeys *k, Py_ssize_t n, PyObject **buf)
{
    PyObject *const *v = (PyObject *const *)mp->ma_values;
    if (n > SPLIT_READ_MAX) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030B0000
    /* a split table's entries are (key, value), its values NULL; the dict's
     * order (its length, then its indexes) before its values */
    const UnicodeEntry *e = DICT_ENTRIES(k);
    const uint8_t *order = (const uint8_t *)v - 2;
    if (k->dk_kind != 2 || order[0] != n) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (order[-1 - i] != i) {
            return 0;
        }
        buf[2 * i] = e[i].me_key;
        buf[2 * i + 1] = v[i];
    }
#else
    /* 3.10 keeps a split dict in its table's order, each value set (as n
     * says: checked) */
    const DictEntry *e = DICT_ENTRIES(k);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (v[i] == NULL) {
            return 0;
        }
        buf[3 * i + 1] = e[i].me_key;
        buf[3 * i + 2] = v[i];
    }
#endif
    return 1;
}
#endif

/* An exact dict's items read directly, when its table has no holes (every
 * entry in use, so entry i is the i-th item): 1 with *first pointing at the
 * first item's key and *step the pointers from one item to the next, the
 * value right after its key; 0 when PyDict_Next must read it. A combined
 * table is read in place: entries of (key, value) (str keys, from 3.11) or
 * (hash, key, value). On 3.10-3.12 a split table of up to SPLIT_READ_MAX
 * items (an instance __dict__, a copy of one, the dicts split_tables makes)
 * is read into split_items (as a combined table of str keys lays its
 * entries out: SPLIT_STEP), when the dict has a value
 * for each key of its shared table in the table's order (3.11, 3.12: its
 * insertion order checked). */
PK_SHARED_INLINE int
dict_table(PyObject *d, PyObject ***first, Py_ssize_t *step)
{
    PyDictObject *mp = (PyDictObject *)d;
    DictKeys *k = (DictKeys *)mp->ma_keys;
    /* (an empty dict's shared empty table has no aligned entries to point at) */
    if (!dict_reads_ok || k->dk_nentries != mp->ma_used || mp->ma_used == 0) {
        return 0;
    }
    if (mp->ma_values == NULL && DICT_COMBINED(k)) {
        PyObject **entries = (PyObject **)DICT_ENTRIES(k);
        *step = DICT_STEP(k);
        /* str keys (3.11 on): (key, value); else (hash, key, value) */
        *first = *step == 2 ? entries : entries + 1;
        return 1;
    }
#if PY_VERSION_HEX < 0x030D0000
    if (mp->ma_values != NULL && dict_split_items(mp, k, mp->ma_used, split_items)) {
        *first = split_items + (SPLIT_STEP - 2);
        *step = SPLIT_STEP;
        return 1;
    }
#endif
    return 0;
}

/* Whether dict_table reads d as PyDict_Next gives it, item by item, with
 * want_step pointers between items (0: any), or does not read it (when
 * refuse_ok) */
static int
dict_table_agrees(PyObject *d, Py_ssize_t want_step, int refuse_ok)
{
    PyObject **p = NULL, *k, *v;
    Py_ssize_t step = 0, pos = 0, i = 0, n = PyDict_GET_SIZE(d);
    if (!dict_table(d, &p, &step)) {
        return refuse_ok;
    }
    if (want_step != 0 && step != want_step) {
        return 0;
    }
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (i >= n || p[i * step] != k || p[i * step + 1] != v) {
            return 0;
        }
        i++;
    }
    return i == n;
}

/* One dict of keys (a tuple) against dict_table: what PyDict_Next gives,
 * item by item, with want_step pointers between entries, read in place; 1 if
 * so. */
static int
dict_reads_agree(PyObject *keys, Py_ssize_t want_step)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys), step = 0;
    PyObject *d = PyDict_New(), **p = NULL;
    int ok = d != NULL;
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        PyObject *val = PyLong_FromSsize_t(1000 + j); /* not a cached int */
        ok = val != NULL && PyDict_SetItem(d, PyTuple_GET_ITEM(keys, j), val) == 0;
        Py_XDECREF(val);
    }
    ok = ok && dict_table_agrees(d, want_step, 0) && dict_table(d, &p, &step) &&
         p != split_items + (SPLIT_STEP - 2); /* in place */
    /* a deleted key leaves a hole: the table is not read then */
    ok = ok && PyDict_DelItem(d, PyTuple_GET_ITEM(keys, 0)) == 0 &&
         !dict_table(d, &p, &step);
    Py_XDECREF(d);
    return ok;
}

#if PY_VERSION_HEX < 0x030D0000
/* Split tables against dict_table: the __dict__ of a class's instance (a
 * split table), its three names set in the table's order, reads as
 * PyDict_Next gives it (into split_items); a second instance's, set in
 * another order, reads right or not at all; the first's after a delete, not
 * at all; 1 if so. */
static int
split_items_agree(void)
{
    PyObject *cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_Probe");
    PyObject *obj[2] = {0}, *dict[2] = {0}, *names = NULL;
    PyObject **p;
    Py_ssize_t step;
    int ok = cls != NULL &&
             (names = Py_BuildValue("(NNN)", PyUnicode_InternFromString("first"),
                                    PyUnicode_InternFromString("second"),
                                    PyUnicode_InternFromString("third"))) != NULL;
    for (int k = 0; ok && k < 2; k++) {
        ok = (obj[k] = PyObject_CallNoArgs(cls)) != NULL;
        for (int i = 0; ok && i < 3; i++) {
            int at = k == 0 ? i : 2 - i; /* the second in another order */
            PyObject *val = PyLong_FromLong(1000 + at);
            ok = val != NULL && PyObject_SetAttr(obj[k], PyTuple_GET_ITEM(names, at), val) == 0;
            Py_XDECREF(val);
        }
        ok = ok && (dict[k] = PyObject_GenericGetDict(obj[k], NULL)) != NULL;
    }
    ok = ok && ((PyDictObject *)dict[0])->ma_values != NULL && /* a split table */
         dict_table_agrees(dict[0], SPLIT_STEP, 0) && dict_table(dict[0], &p, &step) &&
         p == split_items + (SPLIT_STEP - 2) && dict_table_agrees(dict[1], 0, 1) &&
         PyDict_DelItem(dict[0], PyTuple_GET_ITEM(names, 1)) == 0 &&
         !dict_table(dict[0], &p, &step);
    for (int k = 0; k < 2; k++) {
        Py_XDECREF(dict[k]);
        Py_XDECREF(obj[k]);
    }
    Py_XDECREF(names);
    Py_XDECREF(cls);
    return ok;
}
#endif

/* Sets dict_reads_ok when an exact dict's table reads as dict_table expects:
 * for str keys and int keys (small and large tables), the entries are
 * PyDict_Next's items in order; a table with a hole and an empty dict are
 * not read; on 3.10-3.12 split tables too (split_items_agree). A failure of
 * any kind leaves it off. */
PK_SHARED void
dict_reads_check(void)
{
    dict_reads_ok = 1;
    PyObject *s3 = Py_BuildValue("(sss)", "b", "a", "c");
    PyObject *i3 = Py_BuildValue("(iii)", 7, -3, 1 << 20);
    PyObject *s40 = PyTuple_New(40), *e = PyDict_New(), **p = NULL;
    Py_ssize_t step = 0;
    int ok = s3 && i3 && s40 && e;
    for (Py_ssize_t j = 0; ok && j < 40; j++) {
        PyObject *key = PyUnicode_FromFormat("key%zd", 39 - j);
        ok = key != NULL;
        if (ok) {
            PyTuple_SET_ITEM(s40, j, key);
        }
    }
    /* str keys' entries are (key, value) from 3.11 on */
    const Py_ssize_t str_step = PY_VERSION_HEX >= 0x030B0000 ? 2 : 3;
    ok = ok && dict_reads_agree(s3, str_step) && dict_reads_agree(i3, 3) &&
         dict_reads_agree(s40, str_step) && !dict_table(e, &p, &step);
#if PY_VERSION_HEX < 0x030D0000
    ok = ok && split_items_agree();
#endif
    Py_XDECREF(s3);
    Py_XDECREF(i3);
    Py_XDECREF(s40);
    Py_XDECREF(e);
    PyErr_Clear();
    dict_reads_ok = ok;
}
#endif

#if LAYOUT_311 || SPLIT_READS

/* Whether the instances of class t (a heap class) keep their attributes
 * against its shared keys: from 3.11 a class with a managed dict (3.11: inline
 * values, then a split __dict__); on 3.10, which has no managed dicts, one
 * whose instances have a __dict__ */
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
/* The reads of a class made by a check below, whose fields (names, exact
 * strs) the class binds to nothing: as _class_plans.c's record_reads makes
 * them for such a class. A bytes object (reads_of), or NULL. */
static PyObject *
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
#if LAYOUT_311
        else if (code < 0) {
            PyObject **values = VALUES_OF(obj);
            if (values != NULL && (void *)SHARED_KEYS(Py_TYPE(obj)) == r->keys) {
                v = values[-1 - code];
            }
        }
#endif
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

PK_SHARED_INLINE const FieldReads *
reads_of(PyObject *reads_obj)
{
    return reads_obj == NULL ? NULL : (const FieldReads *)PyBytes_AS_STRING(reads_obj);
}

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

/* set on import by int_digits_check, where compiled */
PK_DATA int int_digits_ok;

/* The value of an exact int known to be small and non-negative, read
 * without a call when the representation allows; -1 (maybe with an error
 * set) otherwise. */
PK_SHARED_INLINE Py_ssize_t
small_long(PyObject *o)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#elif INT_DIGITS
    /* up to 3.11: the sign and number of digits in ob_size, then the digits */
    if (int_digits_ok) {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) {
            return 0;
        }
        if (size == 1) {
            return (Py_ssize_t)((PyLongObject *)o)->ob_digit[0];
        }
    }
#endif
    return PyLong_AsSsize_t(o);
}

/* Dicts of the same keys, many times over (unflatten)
 *
 * A dict of n keys costs PyDict_New and n PyDict_SetItem calls, each hashing
 * and probing; that is most of unflatten's time on trees of small dicts. On
 * CPython 3.10 to 3.13 a dict of keys met before (_unflatten.c's kept
 * templates) is made from a template, {k: None} in the dict's insertion
 * order, never shown to anyone: a copy of the template's table in one block,
 * with its keys' counts raised and the values put in its entries, in place of
 * the empty table of a new dict (as PyDict_Copy does, less the values it
 * would copy and then drop). Only keys that key_plain takes (_core.h: no user
 * code runs for their hash or equality) are taken, and a template whose table
 * is not the plain one expected (its keys in order, no holes) is not used.
 * The result is tracked by the GC exactly when inserting the keys and values
 * would have tracked it: a key tracks it when it is a tuple the collector
 * still tracks (asked only of templates with a tuple key: the other keys
 * are never tracked). */

#if DICT_READS
/* The size in bytes of the table of t, a dict with a table of its own */
PK_SHARED size_t
template_size(PyObject *t)
{
    DictKeys *k = (DictKeys *)((PyDictObject *)t)->ma_keys;
    /* _PyDict_KeysSize: the header, the indices, then 2/3 of the slots as entries */
    return sizeof(DictKeys) + DICT_INDEX_BYTES(k) +
           ((DICT_SLOTS(k) << 1) / 3) * (size_t)DICT_STEP(k) * sizeof(PyObject *);
}

/* t, a dict made by inserting n distinct keys that key_plain takes (_core.h),
 * and nothing else, can serve as a template: its table holds its n entries in
 * insertion order, keys and values together */
PK_SHARED int
template_plain(PyObject *t, Py_ssize_t n)
{
    PyDictObject *mp = (PyDictObject *)t;
    DictKeys *k = (DictKeys *)mp->ma_keys;
    return mp->ma_values == NULL && mp->ma_used == n && k->dk_nentries == n && DICT_COMBINED(k);
}

/* The template for the n keys of ins (a tuple), inserted in that order: 1
 * with a new reference in *dict, its table's size in bytes in *size and in
 * *tuples whether a key is a tuple; 0 when these keys cannot have one; -1 on
 * error. */
PK_SHARED int
template_make(PyObject *ins, Py_ssize_t n, PyObject **dict, size_t *size, int *tuples)
{
    *tuples = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(ins, i);
        if (!key_plain(k)) {
            return 0;
        }
        *tuples |= PyTuple_CheckExact(k);
    }
    PyObject *none = Py_None;
    PyObject *t = dict_in_key_order(ins, &none, n, 0);
    if (t == NULL) {
        return -1;
    }
    PyDictObject *mp = (PyDictObject *)t;
    DictKeys *k = (DictKeys *)mp->ma_keys;
    /* a key given twice, a split or holed table, another kind of table */
    int ok = mp->ma_values == NULL && mp->ma_used == n && k->dk_nentries == n &&
             DICT_COMBINED(k) && k->dk_refcnt == 1;
    Py_ssize_t step = DICT_STEP(k);
    PyObject **p = (PyObject **)DICT_ENTRIES(k) + (step - 2);
    for (Py_ssize_t i = 0; ok && i < n; i++, p += step) {
        ok = p[0] == PyTuple_GET_ITEM(ins, i) && p[1] == Py_None;
    }
    if (!ok) {
        Py_DECREF(t);
        return 0;
    }
    *size = template_size(t);
    *dict = t;
    return 1;
}

/* Whether one of the n keys of a table's entries (the first at p, es
 * pointers apart) is one the collector tracks (a tuple: the others never
 * are). Out of line: few templates have tuple keys. */
static PK_NO_INLINE int
key_tracked(PyObject *const *p, Py_ssize_t n, Py_ssize_t es)
{
    for (Py_ssize_t i = 0; i < n; i++, p += es) {
        if (PyObject_GC_IsTracked(p[0])) {
            return 1;
        }
    }
    return 0;
}

/* A new empty dict from PyDict_New, to be given a table: its shared empty
 * table in *empty; NULL when it is not laid out as expected, with *failed 0
 * (no error set), or on error, with *failed 1 (on 3.10 a new dict's values
 * are a shared empty array, never freed) */
static inline PyObject *
dict_empty_new(DictKeys **empty, int *failed)
{
    PyObject *d = PyDict_New();
    *failed = d == NULL;
    if (d == NULL) {
        return NULL;
    }
    PyDictObject *mp = (PyDictObject *)d;
    *empty = (DictKeys *)mp->ma_keys;
    /* the shared empty table: counted up to 3.11, immortal from 3.12 (a
     * count past any real one up to 3.13; 3.14's immortal keys hold
     * PY_SSIZE_T_MIN) */
    Py_ssize_t count = (*empty)->dk_refcnt;
    int shared = PY_VERSION_HEX >= 0x030E0000 ? count == PY_SSIZE_T_MIN : count >= 2;
    if (mp->ma_used != 0 || (PY_VERSION_HEX >= 0x030B0000 && mp->ma_values != NULL) ||
        (*empty)->dk_nentries != 0 || !shared) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Gives a dict from dict_empty_new the table k (one reference, now the
 * dict's) and values vals (NULL: a table of its own) of n items */
static inline void
dict_set_table(PyObject *d, DictKeys *empty, DictKeys *k, PyObject **vals, Py_ssize_t n)
{
    PyDictObject *mp = (PyDictObject *)d;
    /* the shared empty table's reference, given back as dictkeys_decref
     * would (from 3.12 it is immortal, and PyDict_New took none) */
#if PY_VERSION_HEX < 0x030C0000
    empty->dk_refcnt--;
#else
    (void)empty;
#endif
    mp->ma_keys = (PyDictKeysObject *)k;
#if PY_VERSION_HEX >= 0x030B0000
    mp->ma_values = (PyDictValues *)vals;
#else
    mp->ma_values = vals; /* (NULL in place of the shared empty array) */
#endif
    mp->ma_used = n;
}

/* Memory for a dict's keys table, from the allocator CPython frees such a
 * table with (free_keys_object): PyObject_Free up to 3.12, PyMem_Free from
 * 3.13. The two are one allocator by default, but not under
 * PYTHONMALLOC=debug or an allocator installed for one domain. */
static inline DictKeys *
keys_alloc(size_t size)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyMem_Malloc(size);
#else
    return PyObject_Malloc(size);
#endif
}

/* Whether a value makes a dict holding it one the collector tracks, as
 * dict insertion decides it (MAINTAIN_TRACKING) */
static inline int
value_tracks(PyObject *v)
{
    return PyType_IS_GC(Py_TYPE(v)) && (Py_TYPE(v)->tp_is_gc == NULL || Py_TYPE(v)->tp_is_gc(v)) &&
           (!PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v));
}

/* A made dict d, given out in *out: tracked now when track is set, or noted
 * in later (when not NULL) for its caller to track; 1. (From 3.14 PyDict_New
 * made it tracked already.) */
static inline int
dict_done(PyObject *d, int track, Untracked *later, PyObject **out)
{
    if (track && !DICTS_ALWAYS_TRACKED) {
        if (later != NULL) {
            untracked_add(later, d);
        }
        else {
            PyObject_GC_Track(d);
        }
    }
    *out = d;
    return 1;
}

/* A new dict with the table of tmpl (a template of n keys, its table size
 * bytes, held by the caller; tuples: whether a key is a tuple) and, as the
 * value of its i-th key, vals[j * step], j = at[i] (or i where at is NULL):
 * in *out, 1, the references in vals now the dict's; 0 when a new dict is
 * not laid out as expected (nothing made); -1 on error. A dict the collector
 * must track is tracked now, or noted in later (when not NULL) for its
 * caller to track. */
PK_SHARED int
dict_from_template(PyObject *tmpl, size_t size, int tuples, const Py_ssize_t *at,
                   PyObject *const *vals, Py_ssize_t n, Py_ssize_t step, PyObject **out,
                   Untracked *later)
{
    DictKeys *empty;
    int failed;
    PyObject *d = dict_empty_new(&empty, &failed); /* untracked: checked on import */
    if (d == NULL) {
        return failed ? -1 : 0;
    }
    DictKeys *k = keys_alloc(size);
    if (k == NULL) {
        Py_DECREF(d);
        PyErr_NoMemory();
        return -1;
    }
    /* (read after the allocations: the caller's reference keeps it as it is) */
    DictKeys *tk = (DictKeys *)((PyDictObject *)tmpl)->ma_keys;
    memcpy(k, tk, size);
    k->dk_refcnt = 1;
#if PY_VERSION_HEX >= 0x030B0000
    k->dk_version = 0;
#endif
    Py_ssize_t es = DICT_STEP(tk); /* pointers per entry */
    PyObject **p = (PyObject **)DICT_ENTRIES(k) + (es - 2);
    /* as dict insertion decides it (MAINTAIN_TRACKING): a key the collector
     * still tracks, or a value it would */
    int track = tuples && key_tracked(p, n, es);
    for (Py_ssize_t i = 0; i < n; i++, p += es) {
        PyObject *v = vals[(at != NULL ? at[i] : i) * step];
        Py_INCREF(p[0]); /* the key */
        p[1] = v; /* in place of the template's None, whose count was not raised */
        track = track || value_tracks(v);
    }
    dict_set_table(d, empty, k, NULL, n);
    return dict_done(d, track, later, out);
}
#endif

#if SPLIT_TABLES
/* Dicts made as split tables (3.10-3.12, split_tables_check)
 *
 * A dict of a few str keys made by unflatten again and again (the dicts of a
 * spec's recipe) can share one keys table, as the __dict__s of a class's
 * instances do (PEP 412): each dict then has only its values of its own, a
 * small array, instead of a copy of the whole table. The shared table is a
 * copy of the template's (its keys, no values) made a split table: from 3.11
 * its kind is DICT_KEYS_SPLIT, on 3.10 its lookup function is the one
 * CPython gives split tables (read from a class's instance on import). A
 * holder, an empty dict of that table made by split_holder_make, keeps it: the
 * recipe holds the holder, and CPython frees the table when the holder and the
 * last dict sharing it are gone. A dict made here is what copying an
 * instance's __dict__ gives (dict.copy keeps a split table split): every
 * operation on it is CPython's own, inserting a new str key may add it to the
 * shared table (the other dicts just have no value for it), any other key
 * gives the dict a table of its own. Values arrays: 3.11 and 3.12 put the
 * insertion order and its length (uint8s) and the prefix's size before the
 * values (Objects/dictobject.c's new_values); 3.10 has the values alone, in
 * the keys' order. 3.13 lays values out again (and the bound measured its
 * split tables no faster there): not made there. */

#if PY_VERSION_HEX < 0x030B0000
/* 3.10: the lookup function of a split table, read from a class's instance
 * __dict__ on import */
static void *split_lookup;
#endif

/* Split tables only for templates of up to 32 slots: a capacity of at most
 * 21 values, under CPython's own limit for shared keys (30) */
#define SPLIT_MAX_SLOTS 32

/* A values array of room for cap values, all NULL, of no items in order:
 * the values (as ma_values points at them), or NULL on no memory (no error
 * set) */
static inline PyObject **
split_values_new(Py_ssize_t cap)
{
#if PY_VERSION_HEX >= 0x030B0000
    size_t prefix = ((size_t)cap + 2 + sizeof(PyObject *) - 1) & ~(sizeof(PyObject *) - 1);
    uint8_t *mem = PyMem_Malloc(prefix + (size_t)cap * sizeof(PyObject *));
    if (mem == NULL) {
        return NULL;
    }
    mem[prefix - 1] = (uint8_t)prefix;
    PyObject **vals = (PyObject **)(mem + prefix);
    ((uint8_t *)vals)[-2] = 0; /* the order's length */
#else
    PyObject **vals = PyMem_Malloc((size_t)cap * sizeof(PyObject *));
    if (vals == NULL) {
        return NULL;
    }
#endif
    memset(vals, 0, (size_t)cap * sizeof(PyObject *));
    return vals;
}

/* Frees a values array from split_values_new that no dict took */
static inline void
split_values_free(PyObject **vals)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyMem_Free((uint8_t *)vals - ((uint8_t *)vals)[-1]);
#else
    PyMem_Free(vals);
#endif
}

/* The holder of a split table of the keys of tmpl (a template of n keys,
 * its table size bytes): 1 with a new reference in *out, 0 when these keys
 * get none (not all str, too many), -1 on error */
PK_SHARED int
split_holder_make(PyObject *tmpl, size_t size, Py_ssize_t n, PyObject **out)
{
    DictKeys *tk = (DictKeys *)((PyDictObject *)tmpl)->ma_keys;
    if (!split_tables_ok || n <= 0 || DICT_SLOTS(tk) > SPLIT_MAX_SLOTS ||
        !template_plain(tmpl, n) ||
        tk->dk_nentries + tk->dk_usable != (Py_ssize_t)((DICT_SLOTS(tk) << 1) / 3)) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030B0000
    if (tk->dk_kind != 1) { /* str keys only */
        return 0;
    }
    UnicodeEntry *te = DICT_ENTRIES(tk);
#else
    DictEntry *te = DICT_ENTRIES(tk);
#endif
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_CheckExact(te[i].me_key)) {
            return 0;
        }
    }
    DictKeys *empty;
    int failed;
    PyObject *d = dict_empty_new(&empty, &failed);
    if (d == NULL) {
        return failed ? -1 : 0;
    }
    Py_ssize_t cap = tk->dk_nentries + tk->dk_usable;
    PyObject **vals = split_values_new(cap);
    DictKeys *k = vals != NULL ? keys_alloc(size) : NULL;
    if (k == NULL) {
        if (vals != NULL) {
            split_values_free(vals);
        }
        Py_DECREF(d);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(k, tk, size);
    k->dk_refcnt = 1;
#if PY_VERSION_HEX >= 0x030B0000
    k->dk_version = 0;
    k->dk_kind = 2; /* DICT_KEYS_SPLIT */
    UnicodeEntry *e = DICT_ENTRIES(k);
#else
    k->dk_lookup = split_lookup;
    DictEntry *e = DICT_ENTRIES(k);
#endif
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(e[i].me_key);
        e[i].me_value = NULL; /* (the template's None, whose count was not raised) */
    }
    dict_set_table(d, empty, k, vals, 0);
    *out = d;
    return 1;
}

/* A new dict sharing the split table of holder (from split_holder_make, of
 * n keys, held by the caller), with, as the value of its i-th key,
 * vals[j * step], j = at[i] (or i where at is NULL): in *out, 1, the
 * references in vals now the dict's; 0 when a new dict is not laid out as
 * expected (nothing made); -1 on error. Tracked by the collector as
 * dict_from_template tracks its dicts (str keys: by the values alone). */
PK_SHARED int
dict_split(PyObject *holder, const Py_ssize_t *at, PyObject *const *vals, Py_ssize_t n,
           Py_ssize_t step, PyObject **out, Untracked *later)
{
    DictKeys *empty;
    int failed;
    PyObject *d = dict_empty_new(&empty, &failed);
    if (d == NULL) {
        return failed ? -1 : 0;
    }
    /* (read after the allocation: the caller's reference keeps the holder,
     * but a finalizer run by it may have added keys to the table, which only
     * grows: its first n keys stay the template's) */
    DictKeys *k = (DictKeys *)((PyDictObject *)holder)->ma_keys;
    PyObject **v = split_values_new(k->dk_nentries + k->dk_usable);
    if (v == NULL) {
        Py_DECREF(d);
        PyErr_NoMemory();
        return -1;
    }
    int track = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = vals[(at != NULL ? at[i] : i) * step];
        v[i] = x;
        track = track || value_tracks(x);
    }
#if PY_VERSION_HEX >= 0x030B0000
    /* the insertion order: the keys' own */
    uint8_t *order = (uint8_t *)v - 2;
    *order = (uint8_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        order[-1 - i] = (uint8_t)i;
    }
#endif
    k->dk_refcnt++;
    dict_set_table(d, empty, k, v, n);
    return dict_done(d, track, later, out);
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

#if LAYOUT_311
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

#if DICT_READS
/* Whether d (a dict) has exactly the items of keys and vals (n), in that
 * order, found by lookup too, and its size */
static int
dict_items_are(PyObject *d, PyObject *keys, PyObject *const *vals, Py_ssize_t n)
{
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (i >= n || k != PyTuple_GET_ITEM(keys, i) || v != vals[i] ||
            PyDict_GetItemWithError(d, k) != vals[i]) {
            return 0;
        }
        i++;
    }
    return i == n && PyDict_GET_SIZE(d) == n;
}

/* Sets dict_layout_ok (3.10-3.13) when dict_reads_ok is set (dict_reads_check
 * checked the reads of a table) and dicts copied from a template and given
 * their values in place (dict_from_template) are what inserting gives: for
 * str keys and int keys, values found by lookup, iteration order, size,
 * equality, GC tracking, and the dict still usable (an insert that grows it,
 * a delete, after which its table is not read in place). A failure of any
 * kind leaves it off. */
PK_SHARED void
dict_layout_check(void)
{
    /* a dict made by PyDict_New holds the shared empty table, whose count
     * must come back to where it was */
    PyObject *e0 = PyDict_New();
    DictKeys *empty = e0 ? (DictKeys *)((PyDictObject *)e0)->ma_keys : NULL;
    Py_ssize_t empty_count = empty ? empty->dk_refcnt : -1;
    int ok = dict_reads_ok && e0 != NULL && PyObject_GC_IsTracked(e0) == DICTS_ALWAYS_TRACKED;
    for (int kind = 0; kind < 3 && ok; kind++) {
        /* str keys, int keys, and a float, a tuple (tracked: new) and None */
        PyObject *keys = kind == 0   ? Py_BuildValue("(sss)", "a", "c", "b")
                         : kind == 1 ? Py_BuildValue("(iii)", 7, -3, 1 << 20)
                                     : Py_BuildValue("(d(is)O)", 0.5, 1, "x", Py_None);
        PyObject *vals[3] = {PyList_New(0), PyLong_FromLong(5), Py_None};
        Py_ssize_t key_count = keys ? Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) : 0;
        PyObject *tmpl = NULL, *d = NULL, *want = NULL, *extra = NULL;
        int tuples = 0;
        Py_INCREF(Py_None);
        size_t size = 0;
        ok = keys && vals[0] && vals[1] && template_make(keys, 3, &tmpl, &size, &tuples) == 1 &&
             tuples == (kind == 2) &&
             (want = dict_in_key_order(keys, vals, 3, 1));
        if (ok) {
            for (int i = 0; i < 3; i++) { /* the references the copy takes over */
                Py_INCREF(vals[i]);
            }
            ok = dict_from_template(tmpl, size, tuples, NULL, vals, 3, 1, &d, NULL) == 1;
            for (int i = 0; !ok && i < 3; i++) {
                Py_DECREF(vals[i]);
            }
        }
        PyObject **p = NULL;
        Py_ssize_t step = 0;
        if (ok) {
            ok = dict_items_are(d, keys, vals, 3) &&
                 PyObject_RichCompareBool(d, want, Py_EQ) == 1 &&
                 PyObject_GC_IsTracked(d) == PyObject_GC_IsTracked(want) &&
                 PyObject_GC_IsTracked(d) &&
                 PyObject_GC_IsTracked(tmpl) ==
                     (DICTS_ALWAYS_TRACKED ||
                      (kind == 2 && PyObject_GC_IsTracked(PyTuple_GET_ITEM(keys, 1)))) &&
                 PyDict_GetItemWithError(tmpl, PyTuple_GET_ITEM(keys, 0)) == Py_None;
            if (ok) {
                /* of values the collector does not track: tracked for a
                 * tracked key alone, as inserting them gives */
                PyObject *flat[3] = {Py_None, Py_None, Py_None}, *d2 = NULL;
                PyObject *want2 = dict_in_key_order(keys, flat, 3, 1);
                for (int i = 0; i < 3; i++) { /* the references the copy takes over */
                    Py_INCREF(flat[i]);
                }
                ok = want2 != NULL && dict_from_template(tmpl, size, tuples, NULL, flat, 3, 1, &d2,
                                                           NULL) == 1;
                for (int i = 0; !ok && i < 3; i++) {
                    Py_DECREF(flat[i]);
                }
                ok = ok && PyObject_GC_IsTracked(d2) == PyObject_GC_IsTracked(want2) &&
                     PyObject_RichCompareBool(d2, want2, Py_EQ) == 1;
                Py_XDECREF(d2);
                Py_XDECREF(want2);
            }
            for (long j = 0; ok && j < 20; j++) {
                ok = (extra = PyLong_FromLong(100 + j)) && PyDict_SetItem(d, extra, extra) == 0;
                Py_CLEAR(extra);
            }
            ok = ok && PyDict_DelItem(d, PyTuple_GET_ITEM(keys, 1)) == 0 &&
                 PyDict_GET_SIZE(d) == 22 && !dict_table(d, &p, &step) &&
                 PyDict_GetItemWithError(d, PyTuple_GET_ITEM(keys, 2)) == vals[2];
        }
        Py_XDECREF(d);
        Py_XDECREF(want);
        Py_XDECREF(tmpl);
        /* every reference the copies took is given back */
        ok = ok && Py_REFCNT(vals[0]) == 1 && Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) == key_count;
        Py_XDECREF(keys);
        for (int i = 0; i < 3; i++) {
            Py_XDECREF(vals[i]);
        }
    }
    ok = ok && empty->dk_refcnt == empty_count;
    Py_XDECREF(e0);
    PyErr_Clear();
    dict_layout_ok = ok;
}
#endif

#if SPLIT_TABLES
/* Sets split_tables_ok (3.10-3.12) when dict_layout_ok is set and dicts made
 * by dict_split are what inserting gives and stay right as CPython changes
 * them: for a template of three str keys, values found by lookup, iteration
 * order, size, equality, GC tracking (tracked for a tracked value alone);
 * after a new str key is inserted into one (the shared table grows), the
 * others, and one made after, are unchanged; that key inserted into another,
 * a delete, an int key (a table of its own), a copy; and every reference
 * given back (the keys', the values', the shared table's). On 3.10 it first
 * reads the lookup function of a split table from a class's instance. A
 * failure of any kind leaves it off. */
PK_SHARED void
split_tables_check(void)
{
    PyObject *keys = Py_BuildValue("(sss)", "alpha", "gamma", "beta");
    PyObject *extra = PyUnicode_FromString("zeta"), *ikey = PyLong_FromLong(7);
    PyObject *vals[3] = {PyList_New(0), PyLong_FromLong(5), Py_None};
    PyObject *flat[3] = {Py_None, Py_None, Py_None};
    PyObject *tmpl = NULL, *holder = NULL, *d[3] = {0}, *want = NULL, *want2 = NULL, *c = NULL;
    Py_ssize_t key_count = keys ? Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) : 0;
    size_t size = 0;
    int tuples = 0, ok = dict_layout_ok && keys && extra && ikey && vals[0] && vals[1];
    Py_INCREF(Py_None);
#if PY_VERSION_HEX < 0x030B0000
    {
        /* the lookup function of a split table: an instance __dict__'s */
        PyObject *cls = ok ? PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_Probe")
                           : NULL;
        PyObject *obj = cls ? PyObject_CallNoArgs(cls) : NULL;
        PyObject *dd = obj && PyObject_SetAttrString(obj, "first", Py_None) == 0
                           ? PyObject_GenericGetDict(obj, NULL) : NULL;
        PyDictObject *mp = (PyDictObject *)dd;
        ok = dd != NULL && PyDict_CheckExact(dd) && mp->ma_values != NULL && mp->ma_used == 1 &&
             ((DictKeys *)mp->ma_keys)->dk_nentries == 1;
        split_lookup = ok ? ((DictKeys *)mp->ma_keys)->dk_lookup : NULL;
        Py_XDECREF(dd);
        Py_XDECREF(obj);
        Py_XDECREF(cls);
    }
#endif
    split_tables_ok = ok;
    ok = ok && template_make(keys, 3, &tmpl, &size, &tuples) == 1 && !tuples &&
         split_holder_make(tmpl, size, 3, &holder) == 1 &&
         (want = dict_in_key_order(keys, vals, 3, 1)) &&
         (want2 = dict_in_key_order(keys, flat, 3, 1));
    DictKeys *shared = ok ? (DictKeys *)((PyDictObject *)holder)->ma_keys : NULL;
    /* d[0], d[1]: of vals (one tracked); d[2] of untracked values */
    for (int j = 0; j < 3 && ok; j++) {
        PyObject **from = j < 2 ? vals : flat;
        for (int i = 0; i < 3; i++) { /* the references the dict takes over */
            Py_INCREF(from[i]);
        }
        ok = dict_split(holder, NULL, from, 3, 1, &d[j], NULL) == 1;
        for (int i = 0; !ok && i < 3; i++) {
            Py_DECREF(from[i]);
        }
    }
    ok = ok && dict_items_are(d[0], keys, vals, 3) && dict_items_are(d[2], keys, flat, 3) &&
         PyObject_RichCompareBool(d[0], want, Py_EQ) == 1 &&
         PyObject_RichCompareBool(d[2], want2, Py_EQ) == 1 &&
         PyObject_GC_IsTracked(d[0]) && PyObject_GC_IsTracked(d[0]) == PyObject_GC_IsTracked(want) &&
         PyObject_GC_IsTracked(d[2]) == PyObject_GC_IsTracked(want2) &&
         shared->dk_refcnt == 4 && ((PyDictObject *)d[0])->ma_values != NULL;
    if (ok) {
        /* a new str key in d[0]: the others, and a dict made now, as they were */
        PyObject *d3 = NULL;
        ok = PyDict_SetItem(d[0], extra, extra) == 0 && PyDict_GET_SIZE(d[0]) == 4 &&
             PyDict_GetItemWithError(d[0], extra) == extra &&
             PyDict_GetItemWithError(d[1], extra) == NULL && !PyErr_Occurred() &&
             dict_items_are(d[1], keys, vals, 3);
        for (int i = 0; ok && i < 3; i++) {
            Py_INCREF(vals[i]);
        }
        if (ok && dict_split(holder, NULL, vals, 3, 1, &d3, NULL) != 1) {
            ok = 0;
            for (int i = 0; i < 3; i++) {
                Py_DECREF(vals[i]);
            }
        }
        ok = ok && dict_items_are(d3, keys, vals, 3) &&
             PyObject_RichCompareBool(d3, want, Py_EQ) == 1 &&
             /* that key in d3 too, after its own: last in its order */
             PyDict_SetItem(d3, extra, Py_None) == 0 && PyDict_GET_SIZE(d3) == 4 &&
             PyDict_DelItem(d3, PyTuple_GET_ITEM(keys, 0)) == 0 && PyDict_GET_SIZE(d3) == 3 &&
             (c = PyDict_Copy(d3)) != NULL && PyObject_RichCompareBool(c, d3, Py_EQ) == 1;
        if (ok) {
            Py_ssize_t pos = 0;
            PyObject *k, *v, *seen[3];
            int i = 0;
            while (i < 3 && PyDict_Next(c, &pos, &k, &v)) {
                seen[i++] = k;
            }
            ok = i == 3 && seen[0] == PyTuple_GET_ITEM(keys, 1) &&
                 seen[1] == PyTuple_GET_ITEM(keys, 2) && seen[2] == extra;
        }
        /* an int key: d[1] gets a table of its own, its items as they were */
        ok = ok && PyDict_SetItem(d[1], ikey, ikey) == 0 && PyDict_GET_SIZE(d[1]) == 4 &&
             PyDict_DelItem(d[1], ikey) == 0 && dict_items_are(d[1], keys, vals, 3);
        Py_XDECREF(d3);
    }
    Py_CLEAR(c);
    for (int j = 0; j < 3; j++) {
        Py_CLEAR(d[j]);
    }
    /* the holder's alone now */
    ok = ok && shared->dk_refcnt == 1;
    Py_XDECREF(holder);
    Py_XDECREF(tmpl);
    Py_XDECREF(want);
    Py_XDECREF(want2);
    /* every reference the tables took is given back */
    ok = ok && Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) == key_count && Py_REFCNT(extra) == 1 &&
         Py_REFCNT(vals[0]) == 1;
    Py_XDECREF(keys);
    Py_XDECREF(extra);
    Py_XDECREF(ikey);
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(vals[i]);
    }
    PyErr_Clear();
    split_tables_ok = ok;
}
#endif


#if INT_DIGITS
/* Sets int_digits_ok when small_long's reads of ob_size and ob_digit give
 * what PyLong_AsSsize_t gives, for ints of one digit and of several. */
PK_SHARED void
int_digits_check(void)
{
    static const long long probes[] = {
        0, 1, 7, 255, 32767, 32768, (1LL << 30) - 1, 1LL << 30, 1LL << 31, 1LL << 62,
    };
    int ok = 1;
    int_digits_ok = 1;
    for (size_t i = 0; ok && i < sizeof(probes) / sizeof(probes[0]); i++) {
        PyObject *o = PyLong_FromLongLong(probes[i]);
        if (o == NULL) {
            ok = 0;
            break;
        }
        Py_ssize_t size = Py_SIZE(o);
        /* zero has no digits; a digit holds at most 30 bits */
        ok = (probes[i] == 0) == (size == 0) && (probes[i] < (1LL << 30) || size > 1) &&
             small_long(o) == (Py_ssize_t)probes[i];
        Py_DECREF(o);
    }
    PyErr_Clear();
    int_digits_ok = ok;
}
#endif

/* ------------------------------------------------------------------------ */
/* An OrderedDict's own order
 *
 * CPython's OrderedDict (Objects/odictobject.c, the same on 3.10 to 3.13) is
 * a dict followed by the head and tail of a doubly linked list of nodes, one
 * per key, in the OrderedDict's own order: the order its iterator follows,
 * which is the dict's insertion order unless move_to_end changed it. Reading
 * the list costs a pointer per key; iterating finds each key by its hash.
 * odict_links_check validates the layout on import. */

/* set on import by odict_links_check, where compiled */
PK_DATA int odict_links_ok;

#if ODICT_LINKS
typedef struct OdNode {
    PyObject *key; /* strong */
    Py_hash_t hash;
    struct OdNode *next, *prev;
} OdNode;

typedef struct {
    PyDictObject od_dict;
    OdNode *od_first, *od_last;
    OdNode **od_fast_nodes;
    Py_ssize_t od_fast_nodes_size;
    void *od_resize_sentinel;
    size_t od_state;
    PyObject *od_inst_dict, *od_weakreflist;
} OdObject;
#endif

/* For obj, an instance of OrderedDict or a subclass: 1 when its own order is
 * its dict's insertion order (the keys PyDict_Next gives, the same objects in
 * the same order, and no other), 0 when it is not, -1 when the layout is not
 * known here (the caller iterates). Runs no code; reads at most one node
 * more than the dict has keys. */
PK_SHARED int
odict_in_dict_order(PyObject *obj)
{
#if ODICT_LINKS
    if (odict_links_ok) {
        const OdNode *node = ((OdObject *)obj)->od_first;
        Py_ssize_t pos = 0;
        PyObject *k;
        while (PyDict_Next(obj, &pos, &k, NULL)) {
            if (node == NULL || node->key != k) {
                return 0;
            }
            node = node->next;
        }
        return node == NULL;
    }
#endif
    (void)obj;
    return -1;
}

#if ODICT_LINKS
/* The keys of od's linked list, first to last, as a new list (its prev links
 * and last node checked too), or NULL (with no error set) when they do not
 * link up; at most limit of them. */
static PyObject *
odict_links_keys(PyObject *od, Py_ssize_t limit)
{
    const OdObject *o = (const OdObject *)od;
    const OdNode *node = o->od_first, *prev = NULL;
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && node != NULL; i++) {
        Py_hash_t h = PyObject_Hash(node->key);
        if (i == limit || node->prev != prev || h == -1 || h != node->hash ||
            PyList_Append(keys, node->key) < 0) {
            Py_CLEAR(keys);
            break;
        }
        prev = node;
        node = node->next;
    }
    if (keys != NULL && o->od_last != prev) {
        Py_CLEAR(keys);
    }
    PyErr_Clear();
    return keys;
}

/* Sets odict_links_ok when OrderedDict's instances are laid out as OdObject
 * says (its size; an empty one's list empty) and their lists read as its
 * iterator reads them: str and int keys, after inserts, a move_to_end each
 * way, a delete and a re-insert, in an OrderedDict and in an instance of a
 * subclass; and odict_in_dict_order tells which of them are in their dict's
 * order. A failure of any kind leaves it off. */
PK_SHARED void
odict_links_check(void)
{
    PyTypeObject *t = (PyTypeObject *)OrderedDict_t;
    PyObject *sub = NULL, *bases = NULL;
    int ok = t->tp_basicsize == (Py_ssize_t)sizeof(OdObject);
    odict_links_ok = 1;
    bases = ok ? PyTuple_Pack(1, OrderedDict_t) : NULL;
    sub = bases ? PyObject_CallFunction((PyObject *)&PyType_Type, "sO{}", "_ProbeOd", bases)
                : NULL;
    ok = ok && sub != NULL;
    for (int step = 0; ok && step < 12; step++) {
        PyObject *od = PyObject_CallNoArgs(step % 2 ? sub : OrderedDict_t), *it = NULL,
                 *listed = NULL, *want = NULL;
        int kind = step / 2; /* 0, 1: inserts; 2: move_to_end; 3: to the front; 4: delete,
                                re-insert; 5: int keys */
        listed = od ? odict_links_keys(od, 0) : NULL; /* none yet */
        ok = listed != NULL && PyList_GET_SIZE(listed) == 0 && ((OdObject *)od)->od_first == NULL;
        Py_CLEAR(listed);
        for (long i = 0; ok && i < (kind == 0 ? 3 : 40); i++) {
            PyObject *k = kind == 5 ? PyLong_FromLong(i * 7 - 50) : PyUnicode_FromFormat("k%ld", i);
            ok = k != NULL && PyObject_SetItem(od, k, Py_None) == 0;
            Py_XDECREF(k);
        }
        if (ok && (kind == 2 || kind == 3)) {
            PyObject *k = PyUnicode_FromString(kind == 2 ? "k1" : "k30");
            PyObject *r = k ? PyObject_CallMethod(od, "move_to_end", "OO", k,
                                                  kind == 2 ? Py_True : Py_False)
                            : NULL;
            ok = r != NULL;
            Py_XDECREF(r);
            Py_XDECREF(k);
        }
        if (ok && kind == 4) {
            PyObject *k = PyUnicode_FromString("k3");
            ok = k && PyObject_DelItem(od, k) == 0 && PyObject_SetItem(od, k, Py_True) == 0;
            Py_XDECREF(k);
        }
        it = ok ? PyObject_GetIter(od) : NULL;
        want = it ? PySequence_List(it) : NULL;
        listed = want ? odict_links_keys(od, PyDict_GET_SIZE(od)) : NULL;
        ok = listed != NULL && PyObject_RichCompareBool(listed, want, Py_EQ) == 1;
        for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(want); i++) {
            ok = PyList_GET_ITEM(want, i) == PyList_GET_ITEM(listed, i);
        }
        /* in their dict's order but after move_to_end */
        ok = ok && odict_in_dict_order(od) == (kind == 2 || kind == 3 ? 0 : 1);
        Py_XDECREF(listed);
        Py_XDECREF(want);
        Py_XDECREF(it);
        Py_XDECREF(od);
    }
    PyErr_Clear();
    odict_links_ok = ok;
    Py_XDECREF(sub);
    Py_XDECREF(bases);
}
#endif

