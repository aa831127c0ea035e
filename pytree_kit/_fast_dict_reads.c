/* _fast_dict_reads.c: the fast path dict_reads, an exact dict's entries
 * read from its table in place (and on 3.10-3.12 a split table's, copied out).
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: DICT_READS (_core.h: 3.10 to 3.15, GIL
 * builds). Checked on import by dict_reads_check, which sets dict_reads_ok;
 * off, the callers read with PyDict_Next. What it buys over the portable core
 * (benchmarks/fast_paths.py, callgrind's instructions): up to 2.95x on
 * 3.11.7 and 2.38x on 3.13.0 (a state_dict of 1,000, flatten_up_to), 1.78x
 * on 3.14.10 and 1.86x on 3.15.2 (a state_dict of 100: those runs count the
 * first 2 sizes; benchmarks/results/python3.1X/fast_paths.md).
 *   dict_table        an exact dict's items in place, when it has no holes
 *   dict_reads_check  the import-time check
 * Callers: _classify.c's dict paths, _up_to.c.
 * Calls: only the C API and _core.h (_layouts.h's DictKeys).
 */

#include "_core.h"

/* set on import by dict_reads_check, where compiled */
PK_DATA int dict_reads_ok;

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
 * items (an instance __dict__, a copy of one)
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
