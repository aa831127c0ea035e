/* _mapping_kind.c: the mapping kind of dict and UserDict subclasses, as
 * _pure's _mapping_node reads an instance and _build_mapping rebuilds one.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   mapping_classify  an instance of a class whose plan is PLAN_MAPPING (a
 *                     tokenizer's BatchEncoding, a user's dict subclass): its
 *                     items in leaf order, its insertion order and its own
 *                     attributes (a Carried), the node _mapping_node makes
 *   mapping_build     the instance rebuilt from a mapping node, without its
 *                     __new__ or __init__: dict.__new__ or object.__new__,
 *                     its attributes, then its items by dict's own setter
 * What the class decides (its base, slots, cached properties and own item
 * setters) is _pure.class_plan's answer, kept as the class's plan; what each
 * instance holds is read here, with CPython's public API. Anything this file
 * does not read as the pure engine would without running code of the
 * caller's (a key that is no exact str or int, an attribute name that is no
 * str, a tuple beside an item of its name, an instance whose class sets its
 * items its own way, a UserDict whose data is no dict, a set slot in a
 * rebuild) is left to the pure engine, which reads it or says why not: the
 * answer is the same either way, and so are the errors. OrderedDict and
 * defaultdict subclasses and the sequence kind are the pure engine's.
 * Calls: _core.c (make_node, seq_of), _classify.c (field_named, same_items).
 * Called by _classify.c (classify) and _unflatten.c (build).
 */

#include "_core.h"

/* _kinds' ATTR, MIRROR, DATA, SLOT: how an entry of Carried.state is rebuilt */
enum { HOW_ATTR = 0, HOW_MIRROR = 1, HOW_DATA = 2, HOW_SLOT = 3 };

/* the attributes an instance read here may carry (more: the pure engine's) */
#define STATE_MAX 16

/* The instance's __dict__ as object.__getattribute__ reads it, when it is an
 * exact dict: a new reference; NULL with no error set when it has none (or
 * another kind), NULL with an error on failure. */
static PyObject *
instance_dict(PyObject *obj)
{
    PyObject *d = PyObject_GenericGetAttr(obj, s_dunder_dict);
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return NULL;
        }
        PyErr_Clear();
        return NULL;
    }
    if (!PyDict_CheckExact(d)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* A new exact dict of the storage's items, in its order, when every key is
 * an exact str or every key an exact int (their hash and == run no code):
 * 1 with *items set; 0 for the pure engine; -1 on error. */
static int
items_of(PyObject *storage, PyObject **items)
{
    Py_ssize_t n = PyDict_GET_SIZE(storage), pos = 0, i = 0;
    PyObject *m = PyDict_New(), *k, *v;
    if (m == NULL) {
        return -1;
    }
    int str = 1, num = 1;
    while (PyDict_Next(storage, &pos, &k, &v)) {
        str &= PyUnicode_CheckExact(k);
        num &= PyLong_CheckExact(k);
        if (!(str || num)) {
            break;
        }
        if (PyDict_SetItem(m, k, v) < 0) {
            Py_DECREF(m);
            return -1;
        }
        i++;
    }
    /* (a collection that changed the storage while it was read: the pure
     * engine reads it again, and says so where it changed) */
    if (!(str || num) || i != n || PyDict_GET_SIZE(storage) != n || PyDict_GET_SIZE(m) != n) {
        Py_DECREF(m);
        return 0;
    }
    *items = m;
    return 1;
}

/* One entry of Carried.state: (name, how, value). New reference. */
static PyObject *
state_entry(PyObject *name, int how, PyObject *value)
{
    PyObject *h = PyLong_FromLong(how);
    if (h == NULL) {
        return NULL;
    }
    PyObject *e = PyTuple_Pack(3, name, h, value);
    Py_DECREF(h);
    return e;
}

/* The instance's items as carried_state looks them up by name: a dict of
 * them (items), or, for a small one, its keys and values tuples in leaf order */
typedef struct {
    PyObject *items, *keys, *values;
} Items;

/* The item named by the exact str name, borrowed, or NULL (with an error set
 * on failure). Runs no code. */
static PyObject *
item_named(const Items *m, PyObject *name)
{
    if (m->items != NULL) {
        return PyDict_GetItemWithError(m->items, name);
    }
    Py_ssize_t j = field_named(m->keys, PyTuple_GET_SIZE(m->keys), name);
    return j < 0 ? NULL : PyTuple_GET_ITEM(m->values, j);
}

/* The instance's own attributes as _pure._carried_state holds them, into
 * *state (a new tuple): 1; 0 for the pure engine; -1 on error. info is the
 * class's plan (base, is_user, slots, has_dict, cached, setters); items the
 * instance's items. With need == 0 (no spec is built) only whether the pure
 * engine must see it is found: *state is left NULL. */
static int
carried_state(PyObject *obj, PyTypeObject *t, PyObject *info, const Items *items,
              PyObject **state, int need)
{
    int user = PyTuple_GET_ITEM(info, 1) == Py_True;
    PyObject *slots = PyTuple_GET_ITEM(info, 2), *cached = PyTuple_GET_ITEM(info, 4);
    int has_dict = PyTuple_GET_ITEM(info, 3) == Py_True;
    int setters = PyTuple_GET_SIZE(PyTuple_GET_ITEM(info, 5)) > 0;
    *state = NULL;
    if (!need && !setters) {
        return 1; /* nothing to check: the attributes go into no spec */
    }
    /* the entries, each a new reference; more than STATE_MAX: the pure engine's */
    PyObject *out[STATE_MAX], *d = NULL, *held = NULL;
    Py_ssize_t n_out = 0;
    int others = 0, r = -1;
    if (has_dict) {
        d = instance_dict(obj);
        if (d == NULL && PyErr_Occurred()) {
            goto done;
        }
    }
    if (d != NULL && PyDict_GET_SIZE(d) > 0) {
        /* its items held first, in a copy of its own, as list(dict.items(d))
         * holds them: an allocation below may collect garbage, whose
         * finalizers could change d */
        if ((held = PyDict_Copy(d)) == NULL) {
            goto done;
        }
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(held, &pos, &name, &value)) {
            if (!PyUnicode_CheckExact(name) || n_out == STATE_MAX) {
                r = 0; /* (its == could run code; or many attributes) */
                goto done;
            }
            PyObject *entry = NULL;
            int in_cached = PySet_Contains(cached, name);
            if (in_cached < 0) {
                goto done;
            }
            if (user && PyUnicode_Compare(name, s_data) == 0) {
                entry = state_entry(name, HOW_DATA, Py_None);
            }
            else if (in_cached) {
                continue;
            }
            else {
                PyObject *item = item_named(items, name);
                if (item == NULL && PyErr_Occurred()) {
                    goto done;
                }
                if (item != NULL && (PyTuple_CheckExact(value) || PyTuple_CheckExact(item))) {
                    r = 0; /* _same_value compares tuples item by item */
                    goto done;
                }
                if (item != NULL && item == value) {
                    entry = state_entry(name, HOW_MIRROR, Py_None); /* a ModelOutput built bare */
                }
                else {
                    entry = state_entry(name, HOW_ATTR, value);
                    others = 1;
                }
            }
            if (entry == NULL) {
                goto done;
            }
            out[n_out++] = entry;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
        PyObject *pair = PyTuple_GET_ITEM(slots, i);
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *desc = PyTuple_GET_ITEM(pair, 1);
        if (Py_TYPE(desc) != &PyMemberDescr_Type || n_out == STATE_MAX) {
            r = 0;
            goto done;
        }
        PyObject *value = Py_TYPE(desc)->tp_descr_get(desc, obj, (PyObject *)t);
        if (value == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                goto done;
            }
            PyErr_Clear(); /* unset */
            continue;
        }
        int in_cached = PySet_Contains(cached, name);
        PyObject *entry = in_cached == 0 ? state_entry(name, HOW_SLOT, value) : NULL;
        Py_DECREF(value);
        if (in_cached < 0 || (in_cached == 0 && entry == NULL)) {
            goto done;
        }
        if (entry != NULL) {
            out[n_out++] = entry;
            others = 1;
        }
    }
    if (others && setters) {
        r = 0; /* the pure engine says why it is refused (_follows_items) */
        goto done;
    }
    if (need && (*state = seq_of(0, out, n_out)) == NULL) {
        goto done;
    }
    r = 1;
done:
    for (Py_ssize_t i = 0; i < n_out; i++) {
        Py_DECREF(out[i]);
    }
    Py_XDECREF(held);
    Py_XDECREF(d);
    return r;
}

/* A storage of at most SMALL_DICT items whose keys are all exact str or all
 * exact int: its keys and values in leaf order (*keys, *values: new tuples)
 * and its insertion order (*order: a new tuple, or None when it is the leaf
 * order), read in one pass and sorted in place, with no allocation between
 * reading the storage and holding its items. 1; 0 when it is no such
 * storage; -1 on error. */
static int
small_items(PyObject *storage, PyObject **keys, PyObject **values, PyObject **order)
{
    PyObject *ins[SMALL_DICT], *ks[SMALL_DICT], *vs[SMALL_DICT], *k, *v;
    Py_ssize_t n = PyDict_GET_SIZE(storage), pos = 0, i = 0;
    if (n > SMALL_DICT) {
        return 0;
    }
    int str = 1, num = 1, permuted = 0;
    while (i < n && PyDict_Next(storage, &pos, &k, &v)) {
        str &= PyUnicode_CheckExact(k);
        num &= PyLong_CheckExact(k);
        ins[i] = ks[i] = k;
        vs[i] = v;
        i++;
    }
    if (!(str || num) || i != n || PyDict_Next(storage, &pos, &k, &v)) {
        return 0;
    }
    for (i = 0; i < n; i++) { /* held before anything allocates */
        Py_INCREF(ins[i]);
        Py_INCREF(vs[i]);
    }
    for (Py_ssize_t a = 1; a < n; a++) { /* an insertion sort: no code runs */
        PyObject *kk = ks[a], *vv = vs[a];
        Py_ssize_t b = a;
        while (b > 0 && key_lt(kk, ks[b - 1], str)) {
            ks[b] = ks[b - 1];
            vs[b] = vs[b - 1];
            b--;
        }
        permuted |= b != a;
        ks[b] = kk;
        vs[b] = vv;
    }
    *keys = seq_of(0, ks, n);
    *values = *keys ? seq_of(0, vs, n) : NULL;
    *order = *values ? (permuted ? seq_of(0, ins, n) : Py_NewRef(Py_None)) : NULL;
    for (i = 0; i < n; i++) {
        Py_DECREF(ins[i]);
        Py_DECREF(vs[i]);
    }
    if (*order == NULL) {
        Py_CLEAR(*keys);
        Py_CLEAR(*values);
        return -1;
    }
    return 1;
}

/* Any storage whose keys are all exact str or all exact int, through a dict
 * of its items (*items, a new dict, kept for carried_state's lookups): as
 * small_items. */
static int
all_items(PyObject *storage, PyObject **items, PyObject **keys, PyObject **values,
          PyObject **order)
{
    int r = items_of(storage, items);
    if (r <= 0) {
        return r;
    }
    Py_ssize_t n = PyDict_GET_SIZE(*items);
    PyObject *ins = PyDict_Keys(*items);
    if (ins == NULL || (*order = PyList_AsTuple(ins)) == NULL || PyList_Sort(ins) < 0 ||
        (*keys = PyList_AsTuple(ins)) == NULL) {
        goto fail;
    }
    Py_CLEAR(ins);
    if (same_items(*order, *keys)) {
        Py_SETREF(*order, Py_NewRef(Py_None));
    }
    if ((*values = PyTuple_New(n)) == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemWithError(*items, PyTuple_GET_ITEM(*keys, i));
        if (v == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(*keys, i));
            }
            goto fail;
        }
        PyTuple_SET_ITEM(*values, i, Py_NewRef(v));
    }
    return 1;
fail:
    Py_XDECREF(ins);
    Py_CLEAR(*items);
    Py_CLEAR(*keys);
    Py_CLEAR(*order);
    Py_CLEAR(*values);
    return -1;
}

/* An instance of a class whose plan is PLAN_MAPPING (e->info its answer, less
 * the code), as _pure._mapping_node reads it: 1 with f filled, 2 for the pure
 * engine, -1 on error. The lists being read were copied (stack_freeze):
 * reading the __dict__ may run a descriptor of the caller's. */
PK_SHARED int
mapping_classify(Ctx *c, PyObject *obj, TypeEntry *e, Found *f)
{
    PyObject *info = e->info;
    PyTypeObject *t = Py_TYPE(obj);
    int want_node = c->mode != WALK_LEAVES;
    PyObject *storage, *d = NULL, *order = NULL, *state = NULL, *carried = NULL, *aux = NULL;
    Items m = {NULL, NULL, NULL};
    if (PyTuple_GET_ITEM(info, 1) == Py_True) { /* a UserDict: its data, an exact dict */
        if ((d = instance_dict(obj)) == NULL) {
            return PyErr_Occurred() ? -1 : 2;
        }
#if READ_SNAPSHOTS
        /* (a new reference: another thread may set the instance's data) */
        if (PyDict_GetItemRef(d, s_data, &storage) < 0) {
            Py_DECREF(d);
            return -1;
        }
        Py_SETREF(d, storage);
#else
        storage = PyDict_GetItemWithError(d, s_data);
#endif
        if (storage == NULL || !PyDict_CheckExact(storage)) {
            Py_XDECREF(d);
            return PyErr_Occurred() ? -1 : 2;
        }
    }
    else {
        storage = obj; /* the dict's own storage, whatever its methods say */
    }
#if READ_SNAPSHOTS
    /* its items as they were at one moment (taken under its lock) */
    if ((storage = dict_snapshot(storage)) == NULL) {
        Py_XDECREF(d);
        return -1;
    }
    Py_XSETREF(d, storage);
#endif
    int r = small_items(storage, &m.keys, &m.values, &order);
    if (r == 0) {
        r = all_items(storage, &m.items, &m.keys, &m.values, &order);
    }
    Py_XDECREF(d);
    if (r <= 0) {
        return r < 0 ? -1 : 2;
    }
    r = carried_state(obj, t, info, &m, &state, want_node);
    if (r <= 0) {
        r = r < 0 ? -1 : 2;
        goto done;
    }
    r = -1;
    f->node = NULL;
    if (want_node) {
        if (order == Py_None && PyTuple_GET_SIZE(state) == 0) {
            carried = Py_NewRef(nothing_carried);
        }
        else if ((carried = ((PyTypeObject *)Carried_t)->tp_alloc((PyTypeObject *)Carried_t, 0))) {
            /* Carried(order, state), its __init__ done here: it sets the two slots */
            SLOT(carried, off_carried_order) = Py_NewRef(order);
            SLOT(carried, off_carried_state) = Py_NewRef(state);
        }
        if (carried == NULL ||
            (aux = PyTuple_Pack(4, PyTuple_GET_ITEM(info, 0), m.keys, Py_None, carried)) == NULL ||
            (f->node = make_node(K_MAPPING, (PyObject *)t, PyTuple_GET_SIZE(m.keys), aux)) ==
                NULL) {
            goto done;
        }
    }
    f->children = m.values;
    m.values = NULL;
    f->names = m.keys;
    m.keys = NULL;
    f->keymode = KM_MAP;
    f->live = 0;
    f->dict_kind = 0;
    r = 1;
done:
    Py_XDECREF(m.items);
    Py_XDECREF(m.keys);
    Py_XDECREF(m.values);
    Py_XDECREF(order);
    Py_XDECREF(state);
    Py_XDECREF(carried);
    Py_XDECREF(aux);
    return r;
}

/* The items of a mapping node, {keys[i]: ch[i]} inserted in its insertion
 * order (order, or keys when None): a new dict; NULL with no error set when
 * order is not a reordering of keys (the pure engine says why), NULL with an
 * error on failure. */
static PyObject *
items_in_order(PyObject *keys, PyObject *order, PyObject *const *ch, Py_ssize_t n)
{
    PyObject *by_key = dict_in_key_order(keys, ch, n, 1);
    if (by_key == NULL || order == Py_None) {
        return by_key;
    }
    PyObject *m = NULL;
    if (!PyTuple_CheckExact(order) || PyTuple_GET_SIZE(order) != n ||
        (m = PyDict_New()) == NULL) {
        Py_DECREF(by_key);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(order, i);
        PyObject *v = PyDict_GetItemWithError(by_key, k);
        if (v == NULL || PyDict_SetItem(m, k, v) < 0) {
            Py_CLEAR(m);
            break;
        }
    }
    Py_DECREF(by_key);
    return m;
}

/* A dict subclass's node of at most SMALL_DICT children rebuilt, with no dict
 * of its items made on the way: the insertion order is found as positions in
 * keys (its key objects the same as keys', as a spec flatten made, or one
 * unpickled, has them), a mirrored attribute's item by its name. A new
 * reference; a new reference to None where mapping_build's general way is to
 * do it (another order's objects, a DATA entry); NULL on error. state holds
 * ATTR, MIRROR and DATA entries only, and t has a __dict__ if any. */
static PyObject *
small_dict_build(PyTypeObject *t, PyObject *keys, PyObject *order, PyObject *state,
                 PyObject *const *ch, Py_ssize_t n)
{
    Py_ssize_t at[SMALL_DICT];
    for (Py_ssize_t i = 0; i < n; i++) {
        at[i] = i;
    }
    if (order != Py_None) {
        if (!PyTuple_CheckExact(order) || PyTuple_GET_SIZE(order) != n) {
            Py_RETURN_NONE;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = PyTuple_GET_ITEM(order, i);
            Py_ssize_t j = 0;
            while (j < n && PyTuple_GET_ITEM(keys, j) != k) {
                j++;
            }
            if (j == n) {
                Py_RETURN_NONE;
            }
            at[i] = j;
        }
    }
    Py_ssize_t n_state = PyTuple_GET_SIZE(state);
    for (Py_ssize_t i = 0; i < n_state; i++) {
        if (PyLong_AsLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(state, i), 1)) == HOW_DATA) {
            Py_RETURN_NONE;
        }
    }
    PyObject *obj = PyDict_Type.tp_new(t, empty_tuple, NULL), *d = NULL;
    if (obj == NULL) {
        return NULL;
    }
    if (n_state) {
        if ((d = instance_dict(obj)) == NULL) {
            Py_DECREF(obj);
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE; /* (a __dict__ of the class's own: the pure engine's) */
        }
        for (Py_ssize_t i = 0; i < n_state; i++) {
            PyObject *entry = PyTuple_GET_ITEM(state, i);
            PyObject *name = PyTuple_GET_ITEM(entry, 0), *value = PyTuple_GET_ITEM(entry, 2);
            if (PyLong_AsLong(PyTuple_GET_ITEM(entry, 1)) == HOW_MIRROR) {
                Py_ssize_t j = PyUnicode_CheckExact(name) ? field_named(keys, n, name) : -1;
                if (j < 0) {
                    PyErr_SetObject(PyExc_KeyError, name);
                    goto fail;
                }
                value = ch[j];
            }
            if (PyDict_SetItem(d, name, value) < 0) {
                goto fail;
            }
        }
        Py_CLEAR(d);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(obj, PyTuple_GET_ITEM(keys, at[i]), ch[at[i]]) < 0) {
            goto fail;
        }
    }
    return obj;
fail:
    Py_XDECREF(d);
    Py_DECREF(obj);
    return NULL;
}

/* A mapping node rebuilt, as _pure._build_mapping does: a new reference, or
 * a new reference to None for the pure engine to build it (an OrderedDict or
 * defaultdict subclass, a set slot, an aux of another shape), NULL on
 * error. */
PK_SHARED PyObject *
mapping_build(PyObject *t, PyObject *aux, PyObject *const *ch, Py_ssize_t arity)
{
    if (!PyTuple_CheckExact(aux) || PyTuple_GET_SIZE(aux) != 4 || !PyType_Check(t)) {
        Py_RETURN_NONE;
    }
    PyObject *base = PyTuple_GET_ITEM(aux, 0), *keys = PyTuple_GET_ITEM(aux, 1);
    PyObject *carried = PyTuple_GET_ITEM(aux, 3);
    int user;
    if (base == s_dict || (PyUnicode_CheckExact(base) && PyUnicode_Compare(base, s_dict) == 0)) {
        user = 0;
        if (!PyType_IsSubtype((PyTypeObject *)t, &PyDict_Type)) {
            Py_RETURN_NONE;
        }
    }
    else if (base == s_userdict ||
             (PyUnicode_CheckExact(base) && PyUnicode_Compare(base, s_userdict) == 0)) {
        user = 1;
    }
    else {
        Py_RETURN_NONE;
    }
    if (!PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != arity ||
        PyTuple_GET_ITEM(aux, 2) != Py_None || Py_TYPE(carried) != (PyTypeObject *)Carried_t) {
        Py_RETURN_NONE;
    }
    PyObject *order = Py_XNewRef(SLOT(carried, off_carried_order));
    PyObject *state = Py_XNewRef(SLOT(carried, off_carried_state));
    PyObject *items = NULL, *obj = NULL, *d = NULL;
    if (order == NULL || state == NULL || !PyTuple_CheckExact(state)) {
        goto pure; /* (a slot unset: the pure engine raises AttributeError) */
    }
    Py_ssize_t n_state = PyTuple_GET_SIZE(state);
    for (Py_ssize_t i = 0; i < n_state; i++) {
        PyObject *entry = PyTuple_GET_ITEM(state, i);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
            goto pure;
        }
        long how = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
        if (how != HOW_ATTR && how != HOW_MIRROR && how != HOW_DATA) {
            goto pure; /* a slot (found in the MRO), or another shape */
        }
    }
    if (n_state && ((PyTypeObject *)t)->tp_dictoffset == 0) {
        goto pure;
    }
    if (!user && arity <= SMALL_DICT) {
        obj = small_dict_build((PyTypeObject *)t, keys, order, state, ch, arity);
        if (obj != Py_None) {
            Py_DECREF(order);
            Py_DECREF(state);
            return obj; /* (or NULL: an error) */
        }
        Py_CLEAR(obj);
    }
    if ((items = items_in_order(keys, order, ch, arity)) == NULL) {
        if (PyErr_Occurred()) {
            goto fail;
        }
        goto pure;
    }
    obj = (user ? &PyBaseObject_Type : &PyDict_Type)->tp_new((PyTypeObject *)t, empty_tuple, NULL);
    if (obj == NULL) {
        goto fail;
    }
    if (n_state) {
        if ((d = instance_dict(obj)) == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            Py_CLEAR(obj); /* (a __dict__ of the class's own: the pure engine's) */
            goto pure;
        }
        for (Py_ssize_t i = 0; i < n_state; i++) {
            PyObject *entry = PyTuple_GET_ITEM(state, i);
            PyObject *name = PyTuple_GET_ITEM(entry, 0), *value = PyTuple_GET_ITEM(entry, 2);
            long how = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
            if (how == HOW_MIRROR) {
                value = PyDict_GetItemWithError(items, name);
                if (value == NULL) {
                    if (!PyErr_Occurred()) {
                        PyErr_SetObject(PyExc_KeyError, name);
                    }
                    goto fail;
                }
            }
            else if (how == HOW_DATA) {
                value = items;
            }
            if (PyDict_SetItem(d, name, value) < 0) {
                goto fail;
            }
        }
    }
    if (!user) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(items, &pos, &k, &v)) {
            if (PyDict_SetItem(obj, k, v) < 0) {
                goto fail;
            }
        }
    }
    Py_DECREF(order);
    Py_DECREF(state);
    Py_DECREF(items);
    Py_XDECREF(d);
    return obj;
pure:
    Py_XDECREF(order);
    Py_XDECREF(state);
    Py_XDECREF(items);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(order);
    Py_XDECREF(state);
    Py_XDECREF(items);
    Py_XDECREF(obj);
    Py_XDECREF(d);
    return NULL;
}
