/* _fast_split_tables.c: the fast path split_tables, the dicts of a spec's
 * unflatten recipe made as split tables sharing one keys table.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: SPLIT_TABLES (_core.h: 3.10 to 3.12, GIL
 * builds, with dict_tables). Checked on import by split_tables_check, which
 * sets split_tables_ok; off, a recipe's dicts are copies of the template's
 * table (dict_tables). What it buys over dict_tables
 * (benchmarks/fast_paths.py): FIGURE_split_tables.
 *   split_holder_make  a split table of a template's str keys, kept by an
 *                      empty dict (the recipe holds it)
 *   dict_split         a dict sharing that table, with values of its own
 *   split_tables_check the import-time check
 * Callers: _unflatten.c's recipes.
 * Calls: only the C API and _core.h (_fast_dict_tables.c's dict makers).
 */

#include "_core.h"

/* set on import by split_tables_check, where compiled */
PK_DATA int split_tables_ok;

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
