/* _fast_dict_tables.c: the fast path dict_tables, unflatten's dicts of keys
 * met before made as copies of a kept template's table.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: DICT_TABLES (_core.h: 3.10 to 3.15, GIL
 * builds, with dict_reads, whose check it needs; and 3.13t, where templates
 * are kept only in a spec's recipe, written once). Checked on import by
 * dict_layout_check, which sets dict_layout_ok; off, unflatten inserts each
 * key (PyDict_SetItem). What it buys over the portable core
 * (benchmarks/fast_paths.py): up to 2.92x on 3.11.7 and
 * 2.90x on 3.13.0 (a state_dict of 100, unflatten; records of 1,000 2.9x),
 * 2.18x on 3.14.10 and 2.38x on 3.15.2.
 *   template_make, template_size, template_plain  a template {k: None}
 *   dict_from_template  a dict made as a copy of a template's table, its
 *                       values written in, tracked as inserting would
 *   dict_empty_new, dict_set_table, keys_alloc, value_tracks, dict_done
 *                       a new dict given a table (this file's own)
 *   dict_layout_check   the import-time check
 * Callers: _unflatten.c's dict_of and recipes.
 * Calls: only the C API and _core.h (dict_in_key_order, key_plain, dict_table).
 */

#include "_core.h"

/* set on import by dict_layout_check, where compiled */
PK_DATA int dict_layout_ok;

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

#if DICT_TABLES
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
#ifdef Py_GIL_DISABLED
    k->dk_mutex = 0; /* (a template's table is never shared: unlocked already) */
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


#if DICT_TABLES
#if DICT_READS
#define table_whole dict_table
#else
/* Where dict_reads is out (3.13t), the part of its dict_table that the check
 * asks: whether d's table holds its items with no holes, in place (*first,
 * *step as dict_table gives them) */
static int
table_whole(PyObject *d, PyObject ***first, Py_ssize_t *step)
{
    PyDictObject *mp = (PyDictObject *)d;
    DictKeys *k = (DictKeys *)mp->ma_keys;
    if (mp->ma_values != NULL || !DICT_COMBINED(k) || k->dk_nentries != mp->ma_used) {
        return 0;
    }
    *step = DICT_STEP(k);
    *first = (PyObject **)DICT_ENTRIES(k) + (*step - 2);
    return 1;
}
#endif

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

/* Sets dict_layout_ok (3.10-3.15, 3.13t) when dict_reads_ok is set
 * (dict_reads_check checked the reads of a table; 3.13t has none) and dicts copied from a template and given
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
#if DICT_READS
    int ok = dict_reads_ok;
#else
    int ok = 1; /* (3.13t: no reads of a caller's dicts to check first) */
#endif
    ok = ok && e0 != NULL && PyObject_GC_IsTracked(e0) == DICTS_ALWAYS_TRACKED;
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
                 PyDict_GET_SIZE(d) == 22 && !table_whole(d, &p, &step) &&
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
