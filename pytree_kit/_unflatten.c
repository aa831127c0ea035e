/* _unflatten.c: unflatten(spec, leaves).
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   sp_unflatten   reads the nodes backwards with a value stack, building
 *                  each node from its children (tuples and lists in place)
 *   dict_of        a dict node whose keys and order were met before, in this
 *                  call or another: a copy of a kept template (_fast_dict_tables.c)
 *   build          one node of any other kind: dicts (dict_of, dict_in_order,
 *                  big_dict's copies of a remembered order's template),
 *                  namedtuples, records (new_instance), custom and rule nodes
 *                  (_pure.build for the rare ones)
 *   read_leaves    the leaves argument, as _pure._read_leaves reads it
 *   Recipe         a spec unflattened again: its nodes read once into a flat
 *                  array kept in the spec's _recipe slot (recipe_of, recipe_make),
 *                  which recipe_unflatten follows instead of the nodes
 *   pk_unflatten   the entry point FastCall calls (_speedups.h)
 * Calls: _specread.c (small_long), _fast_dict_tables.c (templates), _classify.c
 * (big_orders, key_places), _mapping_kind.c (mapping_build), _core.h.
 */

#include "_core.h"

static int
is_plain_tuple_subtype(PyObject *t)
{
    if (!PyType_Check(t) || !PyType_IsSubtype((PyTypeObject *)t, &PyTuple_Type)) {
        return 0;
    }
    PyTypeObject *b = (PyTypeObject *)t;
    while (b != NULL && PyType_HasFeature(b, Py_TPFLAGS_HEAPTYPE)) {
        b = b->tp_base;
    }
    return b == &PyTuple_Type;
}

/* t.__new__(t), as the pure engine calls it. When t's metaclass is type and
 * t's tp_new is object's, t.__new__ is object.__new__: CPython keeps a class's
 * tp_new in step with the __new__ its MRO binds (a __new__ of any other kind
 * makes it slot_tp_new). That call is object.__new__(t), whose safety check
 * passes because t->tp_new is object's: so object's tp_new is called at once,
 * with no lookup, argument tuple or wrapper. New reference. */
static PyObject *
new_instance(PyObject *t)
{
    if (Py_TYPE(t) == &PyType_Type && ((PyTypeObject *)t)->tp_new == PyBaseObject_Type.tp_new) {
        return PyBaseObject_Type.tp_new((PyTypeObject *)t, empty_tuple, NULL);
    }
    PyObject *newf = PyObject_GetAttr(t, s_new);
    if (newf == NULL) {
        return NULL;
    }
    PyObject *obj = PyObject_CallOneArg(newf, t);
    Py_DECREF(newf);
    return obj;
}

/* object.__setattr__ on instances of t is plain generic setattr */
static int
generic_setattr_ok(PyObject *t)
{
    if (!PyType_Check(t)) {
        return 0;
    }
    PyObject *mro = ((PyTypeObject *)t)->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (!PyType_HasFeature(b, Py_TPFLAGS_HEAPTYPE) && b->tp_setattro != PyObject_GenericSetAttr) {
            return 0;
        }
    }
    return 1;
}


/* The most entries a record's dict view rebuilt here may have */
#define VIEW_MAX 32

/* For a record's node aux (names, statics, absent, dict_keys) of arity
 * children: how many entries its dict view has (0 when dict_keys is None),
 * with at[i] the child whose value key i takes; or -1 when _pure._set_fields
 * must rebuild it: more than VIEW_MAX keys, static fields, a class that is no
 * dict, or a key that is not an exact str naming one of the children's fields
 * (its lookup could run code, or raises there). No code runs. */
static Py_ssize_t
view_places(PyObject *t, PyObject *aux, Py_ssize_t arity, Py_ssize_t *at)
{
    PyObject *keys = PyTuple_GET_ITEM(aux, 3), *names = PyTuple_GET_ITEM(aux, 0);
    if (keys == Py_None) {
        return 0;
    }
    Py_ssize_t m, n = PyTuple_GET_SIZE(names) < arity ? PyTuple_GET_SIZE(names) : arity;
    if (!PyTuple_CheckExact(keys) || (m = PyTuple_GET_SIZE(keys)) > VIEW_MAX ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(aux, 1)) != 0 ||
        !PyType_IsSubtype((PyTypeObject *)t, &PyDict_Type)) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        /* the last field of that name, as dict(zip(names, children)) keeps */
        if (!PyUnicode_CheckExact(k) || (at[i] = field_named(names, n, k)) < 0) {
            return -1;
        }
    }
    return m;
}

/* Templates kept across calls
 *
 * A dict node's keys (a tuple of keys key_plain takes, up to BIG_DICT of them
 * with an insertion order of their own, any number in key order) and its
 * insertion order are noted in an entry the first time they are met;
 * the second time, in this call or a later one, the entry gets a template in
 * that order (_fast_dict_tables.c's template_make), and each further dict of those
 * keys in that order is a copy of it (dict_from_template). flatten gives the
 * same key tuple to dicts of the same key objects, call after call
 * (_classify.c's dict_orders table), so a tree flattened or unflattened
 * again finds its templates. Entries (Kept) are kept in the memo's templates
 * table (_memo.c), a set chosen by the key objects. An entry holds its keys,
 * order and template alive. Keys of any other type are
 * never noted, so no user object is kept alive here, and nothing dropped from
 * a slot runs user code. An allocation may collect garbage, whose finalizers
 * may unflatten and rewrite any entry: a template is used through a reference
 * of the caller's own, and stored only in an entry that still notes its keys. */

/* The template of the last keys and order met twice in a row in one call
 * (the dicts of a list of records, or of a chain of the same keys): the next
 * node with the same keys tuple and order tuple (as flatten makes them for
 * the same key objects) is a copy of it without a look in the table. Held by
 * a reference of its own, so that a template dropped from the table (by
 * a callback's unflatten) still serves. Keys met once are not noted: a chain
 * of other keys at each level would pay for it at each level. */
typedef struct {
    const void *seen; /* the table's entry of the last dict from a template, or NULL */
    PyObject *keys;  /* borrowed from the spec, or NULL */
    PyObject *order; /* borrowed from the spec, or NULL: key order */
    PyObject *dict;  /* strong or NULL: the template */
    size_t size;
    int tuples;
    Py_ssize_t at[BIG_DICT]; /* with an order: as dict_of's */
} LastTemplate;

#if DICT_TABLES
/* a and b are the same insertion order: both key order (NULL), or tuples of
 * the same objects */
static inline int
same_order(PyObject *a, PyObject *b)
{
    return a == b || (a != NULL && b != NULL && same_items(a, b));
}

/* The key of keys (n > 0 of them) in this order in the templates table (not
 * 0): a hash of the key objects, so that equal tuples of the same keys (a spec
 * read from JSON or a pickle has its own per node) share one entry */
static inline uintptr_t
kept_key(PyObject *keys, PyObject *order, Py_ssize_t n)
{
    PyObject **k = ((PyTupleObject *)keys)->ob_item;
    size_t h = ptr_hash(k[0]) ^ (ptr_hash(k[n - 1]) >> 7) ^ ((size_t)n << 3);
    if (order != NULL) {
        h ^= ptr_hash(PyTuple_GET_ITEM(order, 0)) >> 13;
    }
    return (uintptr_t)h | 1;
}

/* The entry that notes these keys in this order, or NULL */
static inline Kept *
kept_find(MemoTable *t, uintptr_t key, PyObject *keys, PyObject *order)
{
    MemoHead *set = memo_set(t, key);
    for (unsigned int w = 0; w < t->ways; w++) {
        Kept *e = (Kept *)memo_way(t, set, w);
        if (e->head.key == key && same_items(e->keys, keys) && same_order(e->order, order)) {
            return e;
        }
    }
    return NULL;
}

/* Note keys (all as key_plain takes them, else nothing is noted) and order
 * in the table's way memo_victim gives, in place of what it held, which is
 * let go of last. */
static void
kept_note(MemoTable *t, uintptr_t key, PyObject *keys, PyObject *order, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!key_plain(k)) {
            return;
        }
    }
    Kept *e = (Kept *)memo_victim(t, memo_set(t, key));
    Kept old = *e;
    e->head.key = key;
    memo_touch(t, &e->head);
    e->keys = Py_NewRef(keys);
    e->order = Py_XNewRef(order);
    e->dict = NULL;
    e->unusable = 0;
    e->tuples = 0;
    Py_XDECREF(old.keys);
    Py_XDECREF(old.order);
    Py_XDECREF(old.dict);
}


/* The template tp (of size bytes, tuples as template_make says; at: each key
 * of the order's place among the keys, or NULL in key order) given to e,
 * when e is still an entry (the set may have changed: see above) that has
 * none yet */
static void
kept_template(Kept *e, PyObject *tp, size_t size, int tuples, const Py_ssize_t *at, Py_ssize_t n)
{
    if (e == NULL || e->dict != NULL) {
        return;
    }
    e->dict = Py_NewRef(tp);
    e->size = size;
    e->tuples = (uint16_t)tuples;
    for (Py_ssize_t i = 0; at != NULL && i < n; i++) {
        e->at[i] = (uint8_t)at[i];
    }
}
#endif

/* dict(zip(keys, vals[0], vals[step], ...)) inserted in key order (order
 * NULL) or in order (a tuple: a permutation of keys, up to BIG_DICT of
 * them), from a kept template when these keys were met before in this order:
 * 1 with a new reference in *out, the references in vals now the dict's; -1
 * on error, vals untouched. Without a template, a dict in key order is made
 * here by insertion (1); one with an order is left to build's dict_in_order
 * (0, nothing made). A dict made from a template of the same entry as the
 * one before notes it in last (when not NULL). */
static PK_NO_INLINE int
dict_of(PkState *st, PyObject *keys, PyObject *order, PyObject *const *vals, Py_ssize_t n,
        Py_ssize_t step, PyObject **out, Untracked *later, LastTemplate *last)
{
#if DICT_TABLES
    /* (the templates table is the module's, kept across calls: not where the
     * GIL can be off, where only a recipe's templates serve) */
    if (KEEP_ACROSS_CALLS && dict_layout_ok && n > 0) {
        MemoTable *table = &st->memo.templates;
        uintptr_t key = kept_key(keys, order, n);
        Kept *e = kept_find(table, key, keys, order);
        if (e == NULL) {
            kept_note(table, key, keys, order, n);
        }
        else if (!e->unusable) {
            memo_touch(table, &e->head);
            PyObject *t = Py_XNewRef(e->dict);
            size_t size = e->size;
            int tuples = e->tuples;
            Py_ssize_t at[BIG_DICT];
            if (t == NULL) {
                if (order != NULL) {
                    /* each key of the order's place among the keys: all of
                     * them found (a key given twice template_make finds) */
                    if (key_places(((PyTupleObject *)keys)->ob_item,
                                   ((PyTupleObject *)order)->ob_item, n, at) < 0) {
                        return -1;
                    }
                    for (Py_ssize_t i = 0; i < n; i++) {
                        if (at[i] < 0) {
                            e->unusable = 1;
                            goto insert;
                        }
                    }
                }
                int made = template_make(order != NULL ? order : keys, n, &t, &size, &tuples);
                if (made < 0) {
                    return -1;
                }
                /* (the set as it is now: see above) */
                e = kept_find(table, key, keys, order);
                if (made == 0) {
                    if (e != NULL) {
                        e->unusable = 1;
                    }
                    goto insert;
                }
                kept_template(e, t, size, tuples, order != NULL ? at : NULL, n);
            }
            else {
                for (Py_ssize_t i = 0; order != NULL && i < n; i++) {
                    at[i] = e->at[i];
                }
            }
            int r = dict_from_template(t, size, tuples, order != NULL ? at : NULL, vals, n, step,
                                       out, later);
            if (r > 0 && last != NULL && e != NULL && last->seen == e) {
                /* the second in a row from this entry: the template serves the next */
                Py_XSETREF(last->dict, t); /* (a template of plain keys: no user code) */
                last->keys = keys;
                last->order = order;
                last->size = size;
                last->tuples = tuples;
                for (Py_ssize_t i = 0; order != NULL && i < n; i++) {
                    last->at[i] = at[i];
                }
            }
            else {
                if (r > 0 && last != NULL) {
                    last->seen = e;
                }
                Py_DECREF(t);
            }
            if (r != 0) {
                return r;
            }
        }
    }
insert:
#endif
    if (order != NULL) {
        return 0;
    }
    PyObject *d = dict_in_key_order(keys, vals, n, step);
    if (d == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(vals[i * step]);
    }
    *out = d;
    return 1;
}

/* The dict of a dict node with an insertion order, built in that order at
 * once, when the order is a permutation of the node's keys (the same
 * objects, as key_plain takes them, as flatten gives): what building the dict in
 * key order and then re-inserting its items in the given order gives, with
 * one insertion per key. Each key's place among the node's keys is found by
 * its address (key_places). Large orders are noted in big_orders, for the
 * next time. (The dict is not made at its final size at once:
 * _PyDict_NewPresized gives a table for any keys, larger than a str-keyed
 * dict's from 3.11 on, and slower to read.) New reference; None when the
 * general path must do it. */
static PyObject *
dict_in_order(PkState *st, PyObject *keys, PyObject **ch, Py_ssize_t arity, PyObject *order)
{
    if (!PyTuple_CheckExact(order) || PyTuple_GET_SIZE(order) != arity) {
        Py_RETURN_NONE;
    }
    Py_ssize_t inline_at[BIG_DICT + 1];
    Py_ssize_t *at = arity <= BIG_DICT ? inline_at : PyMem_Malloc(arity * sizeof(Py_ssize_t));
    if (at == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *r = NULL;
    if (key_places(((PyTupleObject *)keys)->ob_item, ((PyTupleObject *)order)->ob_item, arity,
                   at) < 0 ||
        (r = PyDict_New()) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < arity; i++) {
        PyObject *k = PyTuple_GET_ITEM(order, i);
        if (at[i] < 0 || !key_plain(k)) {
            Py_SETREF(r, Py_NewRef(Py_None));
            goto done;
        }
        if (PyDict_SetItem(r, k, ch[at[i]]) < 0) {
            Py_CLEAR(r);
            goto done;
        }
    }
    if (PyDict_GET_SIZE(r) != arity) {
        /* a key given twice: not a permutation */
        Py_SETREF(r, Py_NewRef(Py_None));
    }
    else if (arity > BIG_DICT) {
        /* noted for the next time, when its keys are as flatten makes them */
        int sorted = keys_sorted(keys);
        if (sorted < 0 || (sorted && big_order_note(st, keys, order, at, arity) < 0)) {
            Py_CLEAR(r);
        }
    }
done:
    if (at != inline_at) {
        PyMem_Free(at);
    }
    return r;
}

/* Large dicts rebuilt again and again
 *
 * A dict of n keys made by n insertions grows its table several times on the
 * way. A dict node with an insertion order of more than BIG_DICT keys whose
 * order big_orders remembers (_classify.c: flatten notes the orders it
 * sorts, and dict_in_order those it builds) is built from a template {k: None}
 * in that order, made the second time the order comes: each dict is a copy
 * of it (PyDict_Copy clones the table in one block: its kind and size are
 * those of a dict made by inserting the keys) with each value set in place of
 * None (a lookup, no insertion, no growth). Only exact str and int keys are
 * remembered, so no user code runs for their hash or equality. */

/* The dict of a dict node with an insertion order that big_orders has, for
 * these same keys: a copy of the order's template (made here the first time
 * it is needed) with the values set in place. A new reference; None when
 * big_orders does not have the order (dict_in_order builds it, and notes it);
 * NULL on error. */
static PyObject *
big_dict(PkState *st, PyObject *keys, PyObject **ch, Py_ssize_t arity, PyObject *order,
         Untracked *later)
{
    if (!KEEP_ACROSS_CALLS) {
        Py_RETURN_NONE;
    }
    MemoTable *table = &st->memo.big_orders;
    MemoHead *set = memo_set(table, (uintptr_t)PyTuple_GET_ITEM(order, 0));
    BigOrder *e = NULL;
    for (unsigned int i = 0; i < table->ways && e == NULL; i++) {
        BigOrder *x = (BigOrder *)memo_way(table, set, i);
        if (x->order != NULL && same_items(x->order, order) && same_items(x->keys, keys)) {
            e = x;
        }
    }
    if (e == NULL) {
        Py_RETURN_NONE;
    }
    memo_touch(table, &e->head);
    /* the entry's parts held before anything is allocated: an allocation may
     * collect garbage, whose finalizers could unflatten or flatten again and
     * replace the entry */
    PyObject *at_obj = Py_NewRef(e->at);
    PyObject *held = Py_NewRef(e->order);
    PyObject *t = Py_XNewRef(e->dict), *r = NULL;
    if (t == NULL) {
        /* the second time: make the template, in this order */
        if ((t = PyDict_New()) == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < arity; i++) {
            if (PyDict_SetItem(t, PyTuple_GET_ITEM(order, i), Py_None) < 0) {
                goto done;
            }
        }
        /* kept only by the entry it was made for, if that is still there */
        if (e->order == held && e->dict == NULL) {
            e->dict = Py_NewRef(t);
        }
    }
    const Py_ssize_t *at = (const Py_ssize_t *)PyBytes_AS_STRING(at_obj);
#if DICT_TABLES
    /* a copy of the template's table with the values written in (its keys
     * are exact str or int: big_orders keeps no others) */
    if (dict_layout_ok && template_plain(t, arity) &&
        (DICTS_ALWAYS_TRACKED || !PyObject_GC_IsTracked(t))) {
        int made = dict_from_template(t, template_size(t), 0, at, ch, arity, 1, &r, later);
        if (made != 0) {
            for (Py_ssize_t i = 0; made > 0 && i < arity; i++) {
                Py_INCREF(ch[i]); /* the copy took the references: ch keeps its own */
            }
            goto done;
        }
    }
#endif
    r = PyDict_Copy(t);
    for (Py_ssize_t i = 0; r != NULL && i < arity; i++) {
        if (PyDict_SetItem(r, PyTuple_GET_ITEM(order, i), ch[at[i]]) < 0) {
            Py_CLEAR(r);
        }
    }
done:
    Py_XDECREF(t);
    Py_DECREF(held);
    Py_DECREF(at_obj);
    return r;
}

/* A dict node's dict, its keys aux (a tuple of arity keys) and its values
 * ch, in its insertion order (order, or key order when NULL): a copy of a
 * remembered large order's template (big_dict), built in that order at once
 * (dict_in_order), or inserted in key order and then in order. New reference. */
static PyObject *
build_dict(PkState *st, PyObject *aux, PyObject **ch, Py_ssize_t arity, PyObject *order,
           Untracked *later)
{
    PyObject *r;
    if (order != NULL && arity > BIG_DICT && PyTuple_CheckExact(order) &&
        PyTuple_GET_SIZE(order) == arity) {
        r = big_dict(st, aux, ch, arity, order, later);
        if (r != Py_None) {
            return r;
        }
        Py_DECREF(r);
    }
    if (order != NULL) {
        r = dict_in_order(st, aux, ch, arity, order);
        if (r != Py_None) {
            return r;
        }
        Py_DECREF(r);
    }
    PyObject *m = dict_in_key_order(aux, ch, arity, 1);
    if (m == NULL || order == NULL) {
        return m;
    }
    PyObject *seq = PySequence_Fast(order, "a dict order must be a sequence");
    r = seq ? PyDict_New() : NULL;
    if (r == NULL) {
        Py_XDECREF(seq);
        Py_DECREF(m);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *k = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *v = PyObject_GetItem(m, k);
        if (v == NULL || PyDict_SetItem(r, k, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(r);
            Py_DECREF(seq);
            Py_DECREF(m);
            return NULL;
        }
        Py_DECREF(v);
    }
    Py_DECREF(seq);
    Py_DECREF(m);
    return r;
}

/* A dataclass or attrs instance of class t, from its node's aux (names,
 * statics, absent, dict_keys) and children ch: t.__new__(t), each field set
 * with the generic setattr, and a dict view given its values. New reference;
 * None when _pure._set_fields must rebuild it (see view_places). */
static PyObject *
build_record(PyObject *t, PyObject *aux, PyObject **ch, Py_ssize_t arity)
{
    Py_ssize_t at[VIEW_MAX], m = 0;
    if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == 4 &&
        PyTuple_CheckExact(PyTuple_GET_ITEM(aux, 0)) &&
        PyTuple_CheckExact(PyTuple_GET_ITEM(aux, 1)) && generic_setattr_ok(t) &&
        (m = view_places(t, aux, arity, at)) >= 0) {
        PyObject *names = PyTuple_GET_ITEM(aux, 0);
        PyObject *statics = PyTuple_GET_ITEM(aux, 1);
        PyObject *obj = new_instance(t);
        if (obj == NULL) {
            return NULL;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(names);
        if (n > arity) {
            n = arity;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(names, i), ch[i]) < 0) {
                Py_DECREF(obj);
                return NULL;
            }
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(statics); i++) {
            PyObject *pr = PyTuple_GET_ITEM(statics, i);
            if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 2) {
                Py_DECREF(obj);
                PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: bad static field");
                return NULL;
            }
            if (PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(pr, 0), PyTuple_GET_ITEM(pr, 1)) <
                0) {
                Py_DECREF(obj);
                return NULL;
            }
        }
        /* the dict view: each key given its field's value, through the
         * base class's own __setitem__ (OrderedDict's or dict's) */
        int od = m > 0 && PyObject_TypeCheck(obj, (PyTypeObject *)OrderedDict_t);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *k = PyTuple_GET_ITEM(PyTuple_GET_ITEM(aux, 3), i);
            int r;
            if (od) {
                r = PyODict_SetItem(obj, k, ch[at[i]]);
            }
            else if (PyDict_Check(obj)) {
                r = PyDict_SetItem(obj, k, ch[at[i]]);
            }
            else { /* a __new__ that made no dict: dict.__setitem__ says so */
                PyObject *done = PyObject_CallMethod((PyObject *)&PyDict_Type, "__setitem__",
                                                     "OOO", obj, k, ch[at[i]]);
                r = done == NULL ? -1 : 0;
                Py_XDECREF(done);
            }
            if (r < 0) {
                Py_DECREF(obj);
                return NULL;
            }
        }
        return obj;
    }
    Py_RETURN_NONE;
}

/* Build one node from children ch[0..arity) (in leaf order). New reference. */
static PyObject *
build(PkState *st, int kind, PyObject *node, PyObject **ch, Py_ssize_t arity, PyObject *order,
      Untracked *later)
{
    PyObject *t = PyTuple_GET_ITEM(node, 1);
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    /* tuples and lists are built by sp_unflatten itself */
    switch (kind) {
    case K_NONE:
        if (arity == 0) {
            Py_RETURN_NONE;
        }
        break;
    case K_DICT:
        if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == arity) {
            return build_dict(st, aux, ch, arity, order, later);
        }
        break;
    case K_ORDEREDDICT:
        /* OrderedDict(zip(aux, children)), as _pure.build: inserted in order */
        if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == arity) {
            PyObject *r = PyODict_New();
            for (Py_ssize_t i = 0; r != NULL && i < arity; i++) {
                if (PyODict_SetItem(r, PyTuple_GET_ITEM(aux, i), ch[i]) < 0) {
                    Py_CLEAR(r);
                }
            }
            return r;
        }
        break;
    case K_NAMEDTUPLE:
        if (is_plain_tuple_subtype(t)) {
            PyObject *tup = seq_of(0, ch, arity);
            if (tup == NULL) {
                return NULL;
            }
            PyObject *args = PyTuple_Pack(1, tup);
            Py_DECREF(tup);
            if (args == NULL) {
                return NULL;
            }
            PyObject *r = PyTuple_Type.tp_new((PyTypeObject *)t, args, NULL);
            Py_DECREF(args);
            return r;
        }
        break;
    case K_DATACLASS:
    case K_ATTRS: {
        PyObject *r = build_record(t, aux, ch, arity);
        if (r != Py_None) {
            return r;
        }
        Py_DECREF(r);
        break;
    }
    case K_MAPPING: {
        PyObject *r = mapping_build(t, aux, ch, arity);
        if (r != Py_None) {
            return r;
        }
        Py_DECREF(r);
        break;
    }
    case K_CUSTOM:
        /* (aux, None) or optree's (aux, None, entries): children as a tuple */
        if (PyTuple_CheckExact(aux) &&
            (PyTuple_GET_SIZE(aux) == 2 || PyTuple_GET_SIZE(aux) == 3) &&
            PyTuple_GET_ITEM(aux, 1) == Py_None) {
            PyObject *tup = seq_of(0, ch, arity);
            if (tup == NULL) {
                return NULL;
            }
            PyObject *r = PyObject_CallMethodObjArgs(t, s_tree_unflatten, PyTuple_GET_ITEM(aux, 0),
                                                     tup, NULL);
            Py_DECREF(tup);
            return r;
        }
        break;
    default:
        break;
    }
    /* _pure.build(kind, t, aux, children, order) */
    PyObject *lst = seq_of(1, ch, arity);
    if (lst == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(py_build, PyTuple_GET_ITEM(node, 0), t, aux, lst,
                                               order ? order : Py_None, NULL);
    Py_DECREF(lst);
    return r;
}


/* The leaves as a new reference to a list or tuple, read as _pure._read_leaves
 * reads them: a sized iterable whole, an iterator up to one leaf past n. */
static PyObject *
read_leaves(PyObject *leaves, Py_ssize_t n)
{
    if (PyList_CheckExact(leaves) && READ_SNAPSHOTS) {
        return PyList_AsTuple(leaves); /* (under the list's lock) */
    }
    if (PyList_CheckExact(leaves) || PyTuple_CheckExact(leaves)) {
        Py_INCREF(leaves);
        return leaves;
    }
    PyObject *ok = PyObject_CallOneArg(py_refuse_leaves, leaves); /* a str, bytes, mapping */
    if (ok == NULL) {
        return NULL;
    }
    Py_DECREF(ok);
    PyObject *len = PyObject_GetAttr((PyObject *)Py_TYPE(leaves), s_len);
    if (len != NULL) {
        Py_DECREF(len);
        return PySequence_List(leaves);
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return NULL;
    }
    PyErr_Clear();
    PyObject *it = PyObject_GetIter(leaves);
    if (it == NULL) {
        return NULL;
    }
    PyObject *got = PyList_New(0);
    while (got != NULL && PyList_GET_SIZE(got) <= n) {
        PyObject *x = PyIter_Next(it);
        if (x == NULL) {
            if (PyErr_Occurred()) {
                Py_CLEAR(got);
            }
            break;
        }
        int r = PyList_Append(got, x);
        Py_DECREF(x);
        if (r < 0) {
            Py_CLEAR(got);
        }
    }
    Py_DECREF(it);
    if (got != NULL && PyList_GET_SIZE(got) > n) {
        PyErr_Format(PyExc_ValueError, "unflatten: the spec has %zd %s, but more than %zd were given",
                     n, n == 1 ? "leaf" : "leaves", n);
        Py_CLEAR(got);
    }
    return got;
}


/* Whether orders are as flatten makes them: (node index, order) pairs with
 * exact int indexes, strictly ascending (read from the end as the nodes
 * are); anything else is looked up through a dict, as the pure engine does */
static int
orders_as_flatten_makes(PyObject *orders)
{
    Py_ssize_t prev = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(orders); i++) {
        PyObject *pr = PyTuple_GET_ITEM(orders, i);
        Py_ssize_t at;
        if (!PyTuple_CheckExact(pr) || PyTuple_GET_SIZE(pr) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(pr, 0)) ||
            (at = small_long(PyTuple_GET_ITEM(pr, 0))) <= prev) {
            PyErr_Clear();
            return 0;
        }
        prev = at;
    }
    return 1;
}

/* specs of fewer nodes keep unflatten's value stack on the C stack (4 KiB) */
#define UNFLATTEN_INLINE 256

/* From this many containers (nodes that are not leaves), unflatten tracks the
 * containers it makes when it ends (where DEFER_TRACKING: _core.h). A smaller
 * tree sets off at most one collection of the youngest generation (700
 * allocations by default). */
#define DEFER_FROM 512
#if DEFER_FROM <= UNFLATTEN_INLINE
#error "the deferred containers are kept on the heap stack's third part"
#endif

/* Recipes: a spec unflattened again
 *
 * The loop above reads each node tuple (kind and arity by identity, aux), the
 * spec's orders and, for each dict node, the kept templates (a hash, a set,
 * a compare of keys tuples), call after call. The second time a spec is
 * unflattened, its nodes are read once into a Recipe, kept in the spec's _plan
 * slot: a flat array of nodes in the order the loop takes them, each with its
 * kind, arity, order and, for a dict node that has one, its template (as jax
 * keeps a flat node vector per treedef). The recipe is made only for a spec as
 * flatten makes it (its nodes make one tree of its number of leaves, its
 * orders are (index, order) pairs with ascending int indexes), so the loop
 * that follows it checks nothing but what a callback could change (the
 * caller's list). It builds the very tree the loop above builds, calling
 * build() for every node that is not a tuple, a list or a dict from a
 * template, in the same order. A recipe holds the spec's nodes and orders
 * tuples (it is used only while they are still the spec's) and its
 * templates; the collector sees them. The first unflatten of a spec only
 * notes it (_recipe False): a spec unflattened once pays nothing more. */

/* Specs of more nodes than this get no recipe (its array is 40 bytes a node) */
#define RECIPE_MAX_NODES (1 << 16)

typedef struct {
    PyObject *node;  /* borrowed from the recipe's nodes */
    PyObject *order; /* borrowed from the recipe's orders, or NULL */
    PyObject *tmpl;  /* borrowed from the recipe's templates, or NULL */
    Py_ssize_t at;   /* with a template and an order: its places, at[at ..] */
    uint32_t size;   /* with a template: its table's size in bytes */
    int32_t arity;
    uint8_t kind;
    uint8_t tuples; /* with a template: a key is a tuple */
} RecipeStep;

typedef struct {
    PyObject_HEAD
    PyObject *nodes;     /* strong or NULL (cleared): the spec's */
    PyObject *orders;    /* strong or NULL (cleared): the spec's */
    PyObject *templates; /* strong or NULL: a list of the templates */
    Py_ssize_t n;        /* nodes in v */
    Py_ssize_t leaves;
    RecipeStep *v;         /* in the loop's order: v[0] is the last node */
    Py_ssize_t *at;      /* the places of ordered dicts' keys */
} Recipe;

static int
recipe_traverse(Recipe *p, visitproc visit, void *arg)
{
    Py_VISIT(p->nodes);
    Py_VISIT(p->orders);
    Py_VISIT(p->templates);
    return 0;
}

static int
recipe_clear(Recipe *p)
{
    /* (a cleared recipe serves no spec: its nodes are no spec's) */
    Py_CLEAR(p->nodes);
    Py_CLEAR(p->orders);
    Py_CLEAR(p->templates);
    return 0;
}

static void
recipe_dealloc(Recipe *p)
{
    PyObject_GC_UnTrack(p);
    recipe_clear(p);
    PyMem_Free(p->v);
    PyMem_Free(p->at);
    PyObject_GC_Del(p);
}

PK_DATA PyTypeObject Recipe_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pytree_kit._speedups.Recipe",
    .tp_basicsize = sizeof(Recipe),
    .tp_dealloc = (destructor)recipe_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A spec's unflatten recipe (the C engine's, kept in the spec).",
    .tp_traverse = (traverseproc)recipe_traverse,
    .tp_clear = (inquiry)recipe_clear,
};

#if DICT_TABLES
/* A template for dicts of these keys (n > 0) in this order, as dict_of makes
 * them: 1 with a new reference in *t, its size and tuples, and at[] (with an
 * order); 0 when none serves; -1 on error. The one kept in table when there
 * is one (table NULL: a new one, kept nowhere but in the recipe). */
static int
recipe_template(MemoTable *table, PyObject *keys, PyObject *order, Py_ssize_t n, PyObject **t,
              size_t *size, int *tuples, Py_ssize_t *at)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!key_plain(PyTuple_GET_ITEM(keys, i))) {
            return 0;
        }
    }
    uintptr_t key = table != NULL ? kept_key(keys, order, n) : 0;
    Kept *e = table != NULL ? kept_find(table, key, keys, order) : NULL;
    if (e != NULL && e->unusable) {
        return 0;
    }
    if (e != NULL && e->dict != NULL) {
        *t = Py_NewRef(e->dict);
        *size = e->size;
        *tuples = e->tuples;
        for (Py_ssize_t i = 0; order != NULL && i < n; i++) {
            at[i] = e->at[i];
        }
        return 1;
    }
    if (order != NULL) {
        if (key_places(((PyTupleObject *)keys)->ob_item, ((PyTupleObject *)order)->ob_item, n,
                       at) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (at[i] < 0) {
                return 0;
            }
        }
    }
    int made = template_make(order != NULL ? order : keys, n, t, size, tuples);
    if (made > 0 && table != NULL) {
        /* kept, as dict_of keeps it, for the next dict of these keys (the
         * set as it is now: an allocation may have run a finalizer) */
        if ((e = kept_find(table, key, keys, order)) == NULL) {
            kept_note(table, key, keys, order, n);
            e = kept_find(table, key, keys, order);
        }
        kept_template(e, *t, *size, *tuples, order != NULL ? at : NULL, n);
    }
    return made;
}
#endif

/* The order of node idx (borrowed, or NULL: key order), the nodes read
 * from the end: orders[*oi] the next order met, at node *next_at (-1: none
 * left), both moved past idx; or, for orders flatten did not make, looked up
 * in order_map. 0, or -1 on error. */
static inline int
node_order(PyObject *orders, PyObject *order_map, Py_ssize_t idx, Py_ssize_t *oi,
           Py_ssize_t *next_at, PyObject **order)
{
    while (*next_at > idx) { /* (an order of a node that is not a container) */
        *next_at = --*oi >= 0 ? order_index(orders, *oi) : -1;
    }
    if (*next_at == idx) {
        *order = PyTuple_GET_ITEM(PyTuple_GET_ITEM(orders, *oi), 1);
        *next_at = --*oi >= 0 ? order_index(orders, *oi) : -1;
    }
    if (order_map != NULL) {
        PyObject *key = PyLong_FromSsize_t(idx);
        if (key == NULL) {
            return -1;
        }
        *order = PyDict_GetItemWithError(order_map, key);
        Py_DECREF(key);
        if (*order == NULL && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

#if DICT_TABLES
/* Appends a dict node's at[] (arity places) to the recipe's p->at, of
 * *at_n used of *at_cap: 0, or -1 with the error set. */
static int
recipe_at_add(Recipe *p, const Py_ssize_t *at, Py_ssize_t arity, Py_ssize_t *at_n,
              Py_ssize_t *at_cap)
{
    if (*at_n + arity > *at_cap) {
        Py_ssize_t cap = *at_cap ? 2 * *at_cap : 64;
        while (cap < *at_n + arity) {
            cap *= 2;
        }
        Py_ssize_t *grown = PyMem_Realloc(p->at, (size_t)cap * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->at = grown;
        *at_cap = cap;
    }
    memcpy(p->at + *at_n, at, (size_t)arity * sizeof(Py_ssize_t));
    *at_n += arity;
    return 0;
}
#endif

/* The recipe of a spec of these nodes, orders and number of leaves: a new
 * reference; NULL with no error set when it gets none (not as flatten makes
 * it, or too large), NULL with an error on error. */
static Recipe *
recipe_make(PkState *state, PyObject *nodes, PyObject *orders, Py_ssize_t num_leaves)
{
    Py_ssize_t nn = PyTuple_GET_SIZE(nodes), no = PyTuple_GET_SIZE(orders);
    if (nn == 0 || nn > RECIPE_MAX_NODES || !orders_as_flatten_makes(orders)) {
        return NULL;
    }
    Recipe *p = PyObject_GC_New(Recipe, &Recipe_Type);
    if (p == NULL) {
        return NULL;
    }
    p->nodes = Py_NewRef(nodes);
    p->orders = Py_NewRef(orders);
    p->templates = NULL;
    p->n = 0;
    p->leaves = 0;
    p->at = NULL;
    p->v = PyMem_Calloc((size_t)nn, sizeof(RecipeStep));
    Py_ssize_t sp = 0, oi = no - 1;
#if DICT_TABLES
    Py_ssize_t at_n = 0, at_cap = 0; /* p->at's used length and room */
#endif
    Py_ssize_t next_at = oi >= 0 ? order_index(orders, oi) : -1;
    PyObject_GC_Track(p);
    if (p->v == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((p->templates = PyList_New(0)) == NULL) {
        goto fail;
    }
    for (Py_ssize_t idx = nn - 1; idx >= 0; idx--) {
        PyObject *node = PyTuple_GET_ITEM(nodes, idx);
        RecipeStep *pn = &p->v[p->n];
        int kind;
        Py_ssize_t arity;
        if (node_parts(node, &kind, &arity) < 0 || arity > INT32_MAX) {
            PyErr_Clear();
            goto none;
        }
        pn->node = node;
        pn->kind = (uint8_t)kind;
        pn->arity = (int32_t)arity;
        p->n++;
        if (kind == K_LEAF) {
            p->leaves++;
            sp++;
            continue;
        }
        if (arity > sp) {
            goto none;
        }
        sp += 1 - arity;
        if (kind == K_TUPLE || kind == K_LIST) {
            continue;
        }
        PyObject *order = NULL;
        (void)node_order(orders, NULL, idx, &oi, &next_at, &order); /* (no error without a map) */
        pn->order = order;
#if DICT_TABLES
        PyObject *aux = PyTuple_GET_ITEM(node, 3);
        /* A large dict with an order has its template kept in big_orders
         * where that is kept across calls; where it is not (the GIL can be
         * off), in the recipe, its places on the heap. */
        if (kind == K_DICT && dict_layout_ok && arity > 0 && PyTuple_CheckExact(aux) &&
            PyTuple_GET_SIZE(aux) == arity &&
            (order == NULL || ((arity <= BIG_DICT || !KEEP_ACROSS_CALLS) &&
                               PyTuple_CheckExact(order) && PyTuple_GET_SIZE(order) == arity))) {
            Py_ssize_t at_inline[BIG_DICT];
            Py_ssize_t *at = at_inline;
            if (order != NULL && arity > BIG_DICT &&
                (at = PyMem_Malloc((size_t)arity * sizeof(Py_ssize_t))) == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            PyObject *t = NULL;
            size_t size;
            int tuples;
            /* (the module's templates table where it is kept across calls;
             * where the GIL can be off, the recipe's own templates) */
            MemoTable *table = KEEP_ACROSS_CALLS ? &state->memo.templates : NULL;
            int r = recipe_template(table, aux, order, arity, &t, &size, &tuples, at);
            if (r <= 0 || size > UINT32_MAX) {
                if (at != at_inline) {
                    PyMem_Free(at);
                }
                Py_XDECREF(t);
                if (r < 0) {
                    goto fail;
                }
                continue;
            }
            /* the same template for the same keys and order met before
             * in this recipe (the dicts of a list of records) */
            Py_ssize_t nt = PyList_GET_SIZE(p->templates);
            PyObject *last = nt > 0 ? PyList_GET_ITEM(p->templates, nt - 1) : NULL;
            if (last == t) {
                Py_DECREF(t);
            }
            else {
                r = PyList_Append(p->templates, t);
                Py_DECREF(t);
                if (r < 0) {
                    if (at != at_inline) {
                        PyMem_Free(at);
                    }
                    goto fail;
                }
            }
            pn->tmpl = PyList_GET_ITEM(p->templates, PyList_GET_SIZE(p->templates) - 1);
            pn->size = (uint32_t)size;
            pn->tuples = (uint8_t)tuples;
            if (order != NULL) {
                r = recipe_at_add(p, at, arity, &at_n, &at_cap);
                if (at != at_inline) {
                    PyMem_Free(at);
                }
                if (r < 0) {
                    goto fail;
                }
                pn->at = at_n - arity;
            }
        }
#endif
    }
    if (sp == 1 && p->leaves == num_leaves) {
        return p;
    }
    Py_DECREF(p);
    return NULL;
none: /* (no recipe: no error set) */
fail: /* (an error set) */
    Py_DECREF(p);
    return NULL;
}

/* The recipe to follow for spec (whose nodes and orders these are), a new
 * reference; NULL with no error when there is none (the first unflatten of
 * the spec notes it; the second makes the recipe); NULL with an error on
 * error. */
#ifdef Py_GIL_DISABLED
/* Where the GIL can be off, threads may unflatten one spec at once: its slot
 * moves only forward, None to False to a recipe (or True: none), each step a
 * compare-and-swap, so that a thread reads either what was there or what
 * another thread wrote whole. A recipe, once in the slot, stays there for the
 * spec's life (it is never replaced: a thread that read it may be following
 * it), and is never written again: a recipe is read-only once made. The
 * values replaced are None and False, immortal: no reference is given back.
 * A thread that made a recipe another beat it to follows its own, once. */
static int
recipe_slot_swap(PyObject **slot, PyObject *from, PyObject *to)
{
    return __atomic_compare_exchange_n(slot, &from, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static Recipe *
recipe_of(PkState *state, PyObject *spec, PyObject *nodes, PyObject *orders, Py_ssize_t num_leaves)
{
    PyObject **slot = &SLOT(spec, off_recipe);
    PyObject *held = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (held != NULL && Py_TYPE(held) == &Recipe_Type) {
        Recipe *p = (Recipe *)held;
        /* (the spec's slots set again: the loop serves, not a new recipe) */
        return p->nodes == nodes && p->orders == orders ? (Recipe *)Py_NewRef(held) : NULL;
    }
    if (held != Py_False) {
        /* None becomes False, met once; True: no recipe */
        if (held == Py_None) {
            (void)recipe_slot_swap(slot, held, Py_False);
        }
        return NULL;
    }
    Recipe *p = recipe_make(state, nodes, orders, num_leaves);
    if (p == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (p == NULL) {
        (void)recipe_slot_swap(slot, Py_False, Py_True);
        return NULL;
    }
    Py_INCREF(p); /* the slot's, when it takes it */
    if (!recipe_slot_swap(slot, Py_False, (PyObject *)p)) {
        Py_DECREF(p);
    }
    return p;
}
#else
static Recipe *
recipe_of(PkState *state, PyObject *spec, PyObject *nodes, PyObject *orders, Py_ssize_t num_leaves)
{
    PyObject *held = SLOT(spec, off_recipe);
    if (held != NULL && Py_TYPE(held) == &Recipe_Type) {
        Recipe *p = (Recipe *)held;
        if (p->nodes == nodes && p->orders == orders) {
            Py_INCREF(p);
            return p;
        }
        /* (the spec's slots were set again: made again below) */
    }
    else if (held != Py_False) {
        /* None (or True: no recipe); None becomes False, met once */
        if (held != Py_True) {
            Py_XSETREF(SLOT(spec, off_recipe), Py_NewRef(Py_False));
        }
        return NULL;
    }
    Recipe *p = recipe_make(state, nodes, orders, num_leaves);
    if (p == NULL && PyErr_Occurred()) {
        return NULL;
    }
    Py_XSETREF(SLOT(spec, off_recipe), p != NULL ? Py_NewRef((PyObject *)p) : Py_NewRef(Py_True));
    return p;
}
#endif

/* The tree of recipe p from the leaves in seq (a list when is_list, else a
 * tuple) of p's number, with the value stack st and ch of room for p's
 * nodes, as the loop in sp_unflatten builds it. New reference. */
static PyObject *
recipe_unflatten(PkState *state, Recipe *p, PyObject *seq, int is_list, PyObject **st, PyObject **ch,
               Untracked *later)
{
    Py_ssize_t sp = 0, li = p->leaves;
    const RecipeStep *pn = p->v, *end = p->v + p->n;
    for (; pn < end; pn++) {
        Py_ssize_t arity = pn->arity;
        PyObject *v;
        if (pn->kind == K_LEAF) {
            --li;
            if (is_list && li >= PyList_GET_SIZE(seq)) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                goto fail;
            }
            v = is_list ? PyList_GET_ITEM(seq, li) : PyTuple_GET_ITEM(seq, li);
            st[sp++] = Py_NewRef(v);
            continue;
        }
        if (pn->kind == K_TUPLE || pn->kind == K_LIST) {
            v = pn->kind == K_TUPLE ? PyTuple_New(arity) : list_to_fill(arity);
            if (v == NULL) {
                goto fail;
            }
            if (later != NULL && pn->kind == K_LIST) {
                PyObject_GC_UnTrack(v);
                untracked_add(later, v);
            }
            PyObject **items = pn->kind == K_TUPLE ? ((PyTupleObject *)v)->ob_item
                                                   : ((PyListObject *)v)->ob_item;
            for (Py_ssize_t i = 0; i < arity; i++) {
                items[i] = st[sp - 1 - i];
            }
            sp -= arity;
            st[sp++] = v;
            continue;
        }
#if DICT_TABLES
        if (pn->tmpl != NULL) {
            const Py_ssize_t *at = pn->order != NULL ? p->at + pn->at : NULL;
            int r = dict_from_template(pn->tmpl, pn->size, pn->tuples, at, &st[sp - 1], arity,
                                       -1, &v, later);
            if (r < 0) {
                goto fail;
            }
            if (r > 0) {
                sp -= arity;
                st[sp++] = v;
                continue;
            }
        }
#endif
        for (Py_ssize_t i = 0; i < arity; i++) {
            ch[i] = st[sp - 1 - i];
        }
        if ((v = build(state, pn->kind, pn->node, ch, arity, pn->order, later)) == NULL) {
            goto fail;
        }
        for (Py_ssize_t i = 0; i < arity; i++) {
            Py_DECREF(st[--sp]);
        }
        st[sp++] = v;
    }
    return st[0];
fail:
    while (sp > 0) {
        Py_DECREF(st[--sp]);
    }
    return NULL;
}

/* The orders of a spec that flatten did not make, as a dict {node index:
 * order}, as the pure engine reads them: a new reference, or NULL with the
 * error set. */
static PyObject *
order_map_of(PyObject *orders)
{
    PyObject *map = PyDict_New();
    for (Py_ssize_t i = 0; map != NULL && i < PyTuple_GET_SIZE(orders); i++) {
        PyObject *pr = PyTuple_GET_ITEM(orders, i);
        if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 2 ||
            PyDict_SetItem(map, PyTuple_GET_ITEM(pr, 0), PyTuple_GET_ITEM(pr, 1)) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "malformed TreeSpec orders");
            }
            Py_CLEAR(map);
        }
    }
    return map;
}

/* A tuple or list node (kind) of arity children, the first at top and the
 * rest below it on the value stack: their references move into it. A new
 * reference, or NULL (the stack's references left as they were). On 3.10 and
 * 3.11 a list is noted in later (when not NULL) to be tracked when the call
 * ends. */
static inline PyObject *
seq_from_stack(int kind, PyObject **top, Py_ssize_t arity, Untracked *later)
{
    PyObject *v = kind == K_TUPLE ? PyTuple_New(arity) : list_to_fill(arity);
    if (v == NULL) {
        return NULL;
    }
    if (later != NULL && kind == K_LIST) {
        /* (made tracked by PyList_New. Tuples are left so: a dict that takes
         * an untracked tuple as a value stays untracked, as it would for a
         * tuple of atoms) */
        PyObject_GC_UnTrack(v);
        untracked_add(later, v);
    }
    PyObject **items = kind == K_TUPLE ? ((PyTupleObject *)v)->ob_item : ((PyListObject *)v)->ob_item;
    for (Py_ssize_t i = 0; i < arity; i++) {
        items[i] = top[-i];
    }
    return v;
}

/* A dict node (node, its order or NULL) of arity values, the first at top
 * and the rest below it on the value stack, made by dict_of (or as a copy of
 * the last template, last) when its keys and order are as dict_of takes
 * them: 1 with the dict in *v, the values' references now its; 0 when build
 * must make it; -1 on error. */
static inline int
dict_node(PkState *state, PyObject *node, PyObject *order, PyObject **top, Py_ssize_t arity,
          PyObject **v, Untracked *later, LastTemplate *last)
{
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    if (!PyTuple_CheckExact(aux) || PyTuple_GET_SIZE(aux) != arity ||
        (order != NULL &&
         (arity > BIG_DICT || !PyTuple_CheckExact(order) || PyTuple_GET_SIZE(order) != arity))) {
        return 0;
    }
#if DICT_TABLES
    if (aux == last->keys && order == last->order) {
        int r = dict_from_template(last->dict, last->size, last->tuples,
                                   order != NULL ? last->at : NULL, top, arity, -1, v, later);
        if (r != 0) {
            return r;
        }
    }
#endif
    return dict_of(state, aux, order, top, arity, -1, v, later, last);
}

/* Tracks the containers an unflatten call left untracked (unless a callback
 * tracked one: inserting into a dict can), and lets go of them. */
static void
untracked_track(Untracked *u)
{
    for (Py_ssize_t i = 0; i < u->n; i++) {
        PyObject *o = u->items[i];
        if (!PyObject_GC_IsTracked(o)) {
            PyObject_GC_Track(o);
        }
        Py_DECREF(o);
    }
}

/* unflatten(spec, leaves), with the module's state */
static PyObject *
unflatten(PkState *state, PyObject *spec, PyObject *leaves)
{
    PyObject *nodes, *orders, *order_map = NULL, *result = NULL;
    Py_ssize_t n;
    if (spec_parts(spec, &nodes, &orders, &n) < 0) {
        return NULL;
    }
    Py_INCREF(nodes);
    Py_INCREF(orders);
    if ((leaves = read_leaves(leaves, n)) == NULL) {
        Py_DECREF(nodes);
        Py_DECREF(orders);
        return NULL;
    }
    /* Read as the pure engine reads it: leaves[i], checked each time, since a
     * callback (__tree_unflatten__, a rule) may change the caller's list. */
    PyObject *seq = leaves;
    int is_list = PyList_CheckExact(seq);
    Py_ssize_t given = Py_SIZE(seq);
    if (given != n) {
        PyErr_Format(PyExc_ValueError, "unflatten: the spec has %zd %s, but %zd %s given", n,
                     n == 1 ? "leaf" : "leaves", given, given == 1 ? "was" : "were");
        Py_DECREF(seq);
        Py_DECREF(nodes);
        Py_DECREF(orders);
        return NULL;
    }
    /* the second unflatten of a spec on makes and follows its recipe */
    Recipe *recipe = recipe_of(state, spec, nodes, orders, n);
    if (recipe == NULL && PyErr_Occurred()) {
        goto out;
    }
    /* The orders as flatten makes them: (node index, order) pairs with exact
     * int indexes, strictly ascending. Read from the end as the nodes are.
     * Anything else is looked up through a dict, as the pure engine does.
     * (A recipe has read them.) */
    Py_ssize_t no = recipe != NULL ? 0 : PyTuple_GET_SIZE(orders), oi = no - 1;
    if (no > 0 && !orders_as_flatten_makes(orders)) {
        oi = -1;
        if ((order_map = order_map_of(orders)) == NULL) {
            goto out;
        }
    }
    {
        /* the node index of orders[oi], the next order met from the end; -1
         * when none is left */
        Py_ssize_t next_at = oi >= 0 ? order_index(orders, oi) : -1;
        Py_ssize_t nn = PyTuple_GET_SIZE(nodes);
        /* the value stack and the children of one node: at most nn + 1
         * each; and, for a large tree on 3.10 and 3.11, the containers made
         * untracked (see Untracked in _core.h) */
        PyObject *inline_buf[2 * UNFLATTEN_INLINE];
        PyObject **st = inline_buf, **ch = inline_buf + UNFLATTEN_INLINE;
        Untracked deferred = {NULL, 0}, *later = NULL;
        LastTemplate last;
        last.seen = NULL;
        last.keys = last.order = last.dict = NULL; /* (the rest is set with dict) */
        int defer = DEFER_TRACKING && nn - n >= DEFER_FROM;
        if (nn + 1 > UNFLATTEN_INLINE) {
            st = PyMem_Malloc((2 + defer) * (nn + 1) * sizeof(PyObject *));
            if (st == NULL) {
                PyErr_NoMemory();
                goto out;
            }
            ch = st + nn + 1;
            if (defer) {
                deferred.items = ch + nn + 1;
                later = &deferred;
            }
        }
        Py_ssize_t sp = 0, li = n;
        if (recipe != NULL) {
            result = recipe_unflatten(state, recipe, seq, is_list, st, ch, later);
            goto fail; /* (sp is 0: what follows only cleans up) */
        }
        for (Py_ssize_t idx = nn - 1; idx >= 0; idx--) {
            PyObject *node = PyTuple_GET_ITEM(nodes, idx);
            int kind;
            Py_ssize_t arity;
            if (node_parts(node, &kind, &arity) < 0) {
                goto fail;
            }
            if (kind == K_LEAF) {
                if (li <= 0) {
                    PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: too many leaf nodes");
                    goto fail;
                }
                --li;
                if (is_list && li >= PyList_GET_SIZE(seq)) {
                    PyErr_SetString(PyExc_IndexError, "list index out of range");
                    goto fail;
                }
                PyObject *x = is_list ? PyList_GET_ITEM(seq, li) : PyTuple_GET_ITEM(seq, li);
                Py_INCREF(x);
                st[sp++] = x;
                continue;
            }
            if (arity > sp) {
                PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: arity exceeds the nodes");
                goto fail;
            }
            if (kind == K_TUPLE || kind == K_LIST) {
                PyObject *v = seq_from_stack(kind, &st[sp - 1], arity, later);
                if (v == NULL) {
                    goto fail;
                }
                sp -= arity;
                st[sp++] = v;
                continue;
            }
            PyObject *order = NULL;
            if (node_order(orders, order_map, idx, &oi, &next_at, &order) < 0) {
                goto fail;
            }
            PyObject *v;
            if (kind == K_DICT) {
                int r = dict_node(state, node, order, &st[sp - 1], arity, &v, later, &last);
                if (r < 0) {
                    goto fail;
                }
                if (r > 0) {
                    sp -= arity;
                    st[sp++] = v;
                    continue;
                }
            }
            for (Py_ssize_t i = 0; i < arity; i++) {
                ch[i] = st[sp - 1 - i];
            }
            if ((v = build(state, kind, node, ch, arity, order, later)) == NULL) {
                goto fail;
            }
            for (Py_ssize_t i = 0; i < arity; i++) {
                Py_DECREF(st[--sp]);
            }
            st[sp++] = v;
        }
        if (sp != 1) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: the nodes do not make one tree");
            goto fail;
        }
        result = st[0];
        sp = 0;
    fail:
        while (sp > 0) {
            Py_DECREF(st[--sp]);
        }
        untracked_track(&deferred);
        if (st != inline_buf) {
            PyMem_Free(st);
        }
        Py_XDECREF(last.dict);
    }
out:
    Py_XDECREF((PyObject *)recipe);
    Py_XDECREF(order_map);
    Py_DECREF(seq);
    Py_DECREF(nodes);
    Py_DECREF(orders);
    return result;
}

PK_SHARED PyObject *
sp_unflatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unflatten(spec, leaves) takes 2 arguments");
        return NULL;
    }
    return unflatten(pk_state(self), args[0], args[1]);
}

PyObject *
pk_unflatten(PkState *state, PyObject *spec, PyObject *leaves)
{
    return unflatten(state, spec, leaves);
}
