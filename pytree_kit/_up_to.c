/* _up_to.c: flatten_up_to(spec, tree) and flatten_up_to_columns.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   up_to_into       the leaves of a tree up to the spec's nodes, walking both
 *                    at once; runs of leaves and records with only leaves
 *                    below them taken in one go
 *   match            the children of a value that must match a node (dicts by
 *                    the node's keys, records by its fields); _pure._match and
 *                    _pure._mismatch for the rest and for the messages
 *   sp_flatten_up_to(_columns)  one tree, or many trees into columns
 * Calls: _specread.c, _classify.c (plans, classify), _stack.c, _fast_dict_reads.c,
 * _fast_odict_links.c.
 */

#include "_core.h"

typedef struct {
    PyObject *label, *other;
    Stack *s;
} Up;

static int dict_children_match(PyObject *res, Py_ssize_t arity, PyObject *aux, int kind,
                               PyObject **children, PyObject **names, int *keymode);

/* The keys a dict-view record's node (aux (names, (), (), keys)) gives, when
 * the record compares with it as view_keys_are reads it: names the class's
 * field names (the same tuple), exact empty tuples, and keys an exact tuple of
 * exact strs. Else NULL: record_fields builds the record's own aux, and the
 * two are compared as tuples. Borrowed; no code runs. */
static PyObject *
view_keys_of(TypeEntry *e, PyObject *aux)
{
    if (e->info == NULL || !PyTuple_CheckExact(aux) || PyTuple_GET_SIZE(aux) != 4 ||
        PyTuple_GET_ITEM(aux, 0) != PyTuple_GET_ITEM(e->info, 0)) {
        return NULL;
    }
    for (int i = 1; i < 3; i++) {
        PyObject *t = PyTuple_GET_ITEM(aux, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 0) {
            return NULL;
        }
    }
    PyObject *keys = PyTuple_GET_ITEM(aux, 3);
    if (!PyTuple_CheckExact(keys)) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, i))) {
            return NULL;
        }
    }
    return keys;
}

/* Whether the keys of obj, a dict-view record that record_fields took (its
 * keys exact strs), in its order, equal want (view_keys_of's): what comparing
 * the aux record_fields would build with the node's gives. No code runs. */
static int
view_keys_are(PyObject *obj, PyObject *want)
{
    Py_ssize_t pos = 0, i = 0;
    PyObject *k;
    if (PyDict_GET_SIZE(obj) != PyTuple_GET_SIZE(want)) {
        return 0;
    }
    while (PyDict_Next(obj, &pos, &k, NULL)) {
        PyObject *w = PyTuple_GET_ITEM(want, i++);
        if (k != w && PyUnicode_Compare(k, w) != 0) {
            return 0;
        }
    }
    return 1;
}

/* Ask _pure._match; returns 1 with children etc. set, -1 on error. */
static int
match_python(Up *u, PyObject *node, PyObject *obj, PyObject **children, PyObject **names,
             int *keymode)
{
    if (stack_freeze(u->s) < 0) {
        return -1;
    }
    PyObject *st = stack_py(u->s);
    if (st == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallFunctionObjArgs(py_match, node, obj, st, u->label, u->other, NULL);
    Py_DECREF(st);
    if (res == NULL) {
        return -1;
    }
    PyObject *ch = PyTuple_GET_ITEM(res, 0);
    if (PyTuple_Check(ch) || PyList_Check(ch)) {
        Py_INCREF(ch);
    }
    else if ((ch = PySequence_Tuple(ch)) == NULL) {
        Py_DECREF(res);
        return -1;
    }
    *children = ch;
    *keymode = (int)PyLong_AsLong(PyTuple_GET_ITEM(res, 1));
    *names = PyTuple_GET_ITEM(res, 2);
    if (*names == Py_None) {
        *names = NULL;
    }
    else {
        Py_INCREF(*names);
    }
    Py_DECREF(res);
    return 1;
}

static int
mismatch(Up *u, PyObject *node, PyObject *obj)
{
    if (stack_freeze(u->s) < 0) {
        return -1;
    }
    PyObject *st = stack_py(u->s);
    if (st == NULL) {
        return -1;
    }
    PyObject *exc = PyObject_CallFunctionObjArgs(py_mismatch, st, u->label, node, obj, u->other, NULL);
    Py_DECREF(st);
    return raise_returned(exc);
}

static TypeEntry *up_plan(Up *u, Ctx *c, PyTypeObject *ot);

/* Past this many keys, dict_same_keys only takes a dict in the spec's order
 * (an entry's key not at its place is not looked for). */
#define SCAN_KEYS 64

/* dict_same_keys' step: the entry (k, v) to k's place in want, trying *at
 * first; 0 when k is none of want's objects, or not one to trust (str_table:
 * the dict's table holds only exact str keys). */
static inline int
place_value(PyObject *const *want, Py_ssize_t n, PyObject *k, PyObject *v, PyObject **vals,
            Py_ssize_t *at, int str_table)
{
    Py_ssize_t j = *at;
    if (j >= n || want[j] != k) {
        if (n > SCAN_KEYS) {
            return 0;
        }
        for (j = 0; j < n && want[j] != k; j++) {
        }
        if (j == n) {
            return 0;
        }
    }
    if (!str_table && !PyUnicode_CheckExact(k) && !PyLong_CheckExact(k)) {
        return 0; /* a key whose hash might not be what the dict stored */
    }
    vals[j] = v;
    *at = j + 1;
    return 1;
}

/* The values of the exact dict obj, which has n entries, in the order of keys
 * (a tuple of n keys), borrowed into vals, when each of its keys is one of
 * keys' own objects, an exact str or int: one pass over its entries, each to
 * its key's place (the next place tried first, so a dict in the spec's order
 * costs a compare an entry), with no hashing and no lookup. That is what
 * `k in obj` and obj[k] would find for each of keys (a dict tries identity
 * first, and these keys' hashes are fixed). n distinct key objects, each the
 * object at one place, fill every place once. No code runs. 1; else 0 (vals
 * partly written). */
static int
dict_same_keys(PyObject *obj, PyObject *keys, Py_ssize_t n, PyObject **vals)
{
    PyObject *const *want = ((PyTupleObject *)keys)->ob_item;
    Py_ssize_t at = 0, count = 0, pos = 0;
    PyObject *k, *v;
    if (PyDict_GET_SIZE(obj) != n) {
        return 0;
    }
#if DICT_READS
    PyObject **p;
    Py_ssize_t step;
    if (dict_table(obj, &p, &step)) { /* its n entries in place */
        if (step == 2) { /* exact str keys: first those in the spec's order */
            for (; count < n && p[0] == want[count]; count++, p += 2) {
                vals[count] = p[1];
            }
            at = count;
        }
        for (; count < n; count++, p += step) {
            if (!place_value(want, n, p[0], p[1], vals, &at, step == 2)) {
                return 0;
            }
        }
        return 1;
    }
#endif
    while (PyDict_Next(obj, &pos, &k, &v)) {
        if (count == n || !place_value(want, n, k, v, vals, &at, 0)) {
            return 0;
        }
        count++;
    }
    return count == n;
}

/* The children of obj for each kind of node that match() reads itself:
 * each returns 1 with *children, *names and *keymode set, -1 on error (a
 * mismatch's error included), or 0 when the pure engine decides
 * (match_python). They share match()'s arguments. */
#define MATCH_ARGS                                                                         \
    Up *u, Ctx *c, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj, PyObject *t, \
        PyObject *aux, PyObject **children, PyObject **names, int *keymode
#define MATCH_PASS u, c, kind, arity, node, obj, t, aux, children, names, keymode

/* a dict: its values read by the node's keys */
static int
match_dict(MATCH_ARGS)
{
    PyTypeObject *ot = Py_TYPE(obj);
    if (ot == &PyDict_Type && PyTuple_CheckExact(aux) && PyDict_GET_SIZE(obj) == arity &&
        PyTuple_GET_SIZE(aux) == arity) {
        /* read by key identity; a large dict only when it starts with
         * the spec's first key, or when big_orders has its order */
        int read = arity > 0 && arity <= SCAN_KEYS;
        Py_ssize_t pos = 0;
        PyObject *k0, *v0;
        if (arity > SCAN_KEYS && PyDict_Next(obj, &pos, &k0, &v0)) {
            read = k0 == PyTuple_GET_ITEM(aux, 0) || big_order_for(c->st, obj, aux) != NULL;
        }
        if (read) {
            PyObject *values = spare_tuple(c->st, arity);
            if (values == NULL) {
                return -1;
            }
            /* (read after the allocation, which may have run a finalizer) */
            PyObject **items = ((PyTupleObject *)values)->ob_item;
            if (dict_same_keys(obj, aux, arity, items) || big_dict_values(c->st, obj, aux, items)) {
                for (Py_ssize_t j = 0; j < arity; j++) {
                    Py_INCREF(items[j]);
                }
                *children = values;
                Py_INCREF(aux);
                *names = aux;
                *keymode = KM_MAP;
                return 1;
            }
            memset(items, 0, arity * sizeof(PyObject *)); /* borrowed: not the tuple's */
            Py_DECREF(values);
        }
        Py_ssize_t i = 0;
        while (i < arity && PyUnicode_CheckExact(PyTuple_GET_ITEM(aux, i))) {
            i++;
        }
        if (i < arity && stack_freeze(u->s) < 0) {
            return -1; /* keys other than str: their __eq__ may run */
        }
        for (Py_ssize_t i = 0; i < arity; i++) {
            int r = PyDict_Contains(obj, PyTuple_GET_ITEM(aux, i));
            if (r < 0) {
                return -1;
            }
            if (!r) {
                return mismatch(u, node, obj); /* as the pure engine: no lookup again */
            }
        }
        PyObject *values = dict_values(obj, ((PyTupleObject *)aux)->ob_item, arity);
        if (values == NULL) {
            return -1;
        }
        *children = values;
        Py_INCREF(aux);
        *names = aux;
        *keymode = KM_MAP;
        return 1;
    }
    return 0;
}

/* an exact OrderedDict of the node's key objects in the node's order, read
 * in one pass; anything else (equal keys, another order, other keys) the pure
 * engine decides */
static int
match_odict(MATCH_ARGS)
{
    PyTypeObject *ot = Py_TYPE(obj);
    if ((PyObject *)ot == OrderedDict_t && PyTuple_CheckExact(aux) &&
        PyTuple_GET_SIZE(aux) == arity && PyDict_GET_SIZE(obj) == arity) {
        PyObject *keys, *values;
        int r = odict_items(obj, &keys, &values);
        if (r < 0) {
            return -1;
        }
        if (r == 1) {
            Py_ssize_t i = 0;
            while (i < arity && PyTuple_GET_ITEM(keys, i) == PyTuple_GET_ITEM(aux, i)) {
                i++;
            }
            Py_DECREF(keys);
            if (i == arity) {
                *children = values;
                *names = Py_NewRef(aux);
                *keymode = KM_MAP;
                return 1;
            }
            Py_DECREF(values);
        }
    }
    return 0;
}

/* a dataclass or attrs instance of the node's class */
static int
match_record(MATCH_ARGS)
{
    PyTypeObject *ot = Py_TYPE(obj);
    if ((PyObject *)ot == t) {
        TypeEntry *e = up_plan(u, c, ot);
        if (e == NULL) {
            return -1;
        }
        if (e->plan != (kind == K_DATACLASS ? PLAN_DATACLASS : PLAN_ATTRS)) {
            return 0;
        }
        Found f;
        /* a record that is a dict: its keys compared with the node's in
         * place, when the node's aux has the form flatten gives it */
        PyObject *want = PyDict_Check(obj) ? view_keys_of(e, aux) : NULL;
        int r = record_fields(c, NULL, obj, e, kind, &f, want == NULL);
        if (r < 0) {
            return -1;
        }
        if (r == 2) {
            return 0;
        }
        int eq;
        if (want != NULL) {
            eq = view_keys_are(obj, want);
        }
        else {
            PyObject *mine = PyTuple_GET_ITEM(f.node, 3);
            eq = mine == aux ? 1 : PyObject_RichCompareBool(mine, aux, Py_EQ);
            Py_DECREF(f.node);
        }
        if (eq <= 0) {
            Py_DECREF(f.children);
            Py_DECREF(f.names);
            return eq < 0 ? -1 : mismatch(u, node, obj);
        }
        *children = f.children;
        *names = f.names;
        *keymode = KM_ATTR;
        return 1;
    }
    return mismatch(u, node, obj);
}

/* an instance of the node's class with __tree_flatten__ (K_CUSTOM) or a rule
 * (K_RULE): what it returns matched against the node's aux */
static int
match_user(MATCH_ARGS)
{
    PyTypeObject *ot = Py_TYPE(obj);
    if ((PyObject *)ot == t) {
        PyObject *res;
        if (kind == K_CUSTOM) {
            res = PyObject_CallMethodNoArgs(obj, s_tree_flatten);
        }
        else {
            if (!PyTuple_CheckExact(aux) || PyTuple_GET_SIZE(aux) != 3) {
                return 0;
            }
            PyObject *fn = PyObject_GetAttr(PyTuple_GET_ITEM(aux, 0), s_flatten);
            res = fn ? PyObject_CallOneArg(fn, obj) : NULL;
            Py_XDECREF(fn);
        }
        if (res == NULL) {
            return -1;
        }
        int r = dict_children_match(res, arity, aux, kind, children, names, keymode);
        if (r != 0) {
            Py_DECREF(res);
            return r < 0 ? -1 : (r == 1 ? 1 : mismatch(u, node, obj));
        }
        PyObject *ch, *tail, *keys;
        int km;
        r = user_result(c, u->s, res, ot, kind == K_CUSTOM ? py_custom_result : py_rule_result,
                            &ch, &tail, &keys, &km);
        Py_DECREF(res);
        if (r < 0) {
            return -1;
        }
        int eq = 0;
        if (PyTuple_GET_SIZE(ch) == arity) {
            /* tail == the node's, item by item as a tuple compares, ours
             * on the left as in the pure engine: a CUSTOM node's aux is
             * the tail, a RULE node's (rule, *tail) */
            Py_ssize_t at = kind == K_CUSTOM ? 0 : 1, n = PyTuple_GET_SIZE(tail);
            if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == at + n) {
                eq = 1;
                for (Py_ssize_t k = 0; k < n && eq > 0; k++) {
                    eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(tail, k),
                                                  PyTuple_GET_ITEM(aux, at + k), Py_EQ);
                }
            }
        }
        Py_DECREF(tail);
        if (eq <= 0) {
            Py_DECREF(ch);
            Py_DECREF(keys);
            return eq < 0 ? -1 : mismatch(u, node, obj);
        }
        *children = ch;
        *names = keys == Py_None ? NULL : keys;
        if (keys == Py_None) {
            Py_DECREF(keys);
        }
        *keymode = km;
        return 1;
    }
    return mismatch(u, node, obj);
}

/* Children of obj, which must match node; 1 with outputs set, -1 on error. */
static int
match(Up *u, Ctx *c, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj,
      PyObject **children, PyObject **names, int *keymode, int *live)
{
    PyTypeObject *ot = Py_TYPE(obj);
    PyObject *t = PyTuple_GET_ITEM(node, 1);
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    int r = 0;
    *live = 0;
    *names = NULL;
    *keymode = KM_SEQ;
    switch (kind) {
    case K_TUPLE:
        if (ot == &PyTuple_Type && PyTuple_GET_SIZE(obj) == arity) {
            Py_INCREF(obj);
            *children = obj;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_LIST:
        if (ot == &PyList_Type && PyList_GET_SIZE(obj) == arity) {
            Py_INCREF(obj);
            *children = obj;
            *live = 1;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_NONE:
        if (obj == Py_None) {
            Py_INCREF(empty_tuple);
            *children = empty_tuple;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_DICT:
        r = match_dict(MATCH_PASS);
        break;
    case K_ORDEREDDICT:
        r = match_odict(MATCH_PASS);
        break;
    case K_NAMEDTUPLE:
        if ((PyObject *)ot != t) {
            return mismatch(u, node, obj);
        }
        if (PyTuple_GET_SIZE(obj) != arity) {
            break; /* the pure engine decides what this is */
        }
        Py_INCREF(obj);
        *children = obj;
        Py_INCREF(aux);
        *names = aux;
        *keymode = KM_ATTR;
        return 1;
    case K_DATACLASS:
    case K_ATTRS:
        r = match_record(MATCH_PASS);
        break;
    case K_CUSTOM:
    case K_RULE:
        r = match_user(MATCH_PASS);
        break;
    default:
        break;
    }
    return r != 0 ? r : match_python(u, node, obj, children, names, keymode);
}

/* flatten_up_to's common case of __tree_flatten__ or a rule returning
 * (dict, hashable aux): compared with the node without building the keys, as
 * the general path (and the pure engine) would compare them: the children's
 * count, then aux, then each key, ours on the left. Returns 1 with *children
 * (the values), *names and *keymode set, 2 for a mismatch, 0 when the result
 * is not this case (the general path takes it), -1 on error. */
static int
dict_children_match(PyObject *res, Py_ssize_t arity, PyObject *aux, int kind,
                    PyObject **children, PyObject **names, int *keymode)
{
    Py_ssize_t at = kind == K_CUSTOM ? 0 : 1;
    if (READ_SNAPSHOTS) {
        return 0; /* (the dict is read in place: the general path reads a snapshot) */
    }
    if (!PyTuple_CheckExact(res) || PyTuple_GET_SIZE(res) != 2 ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(res, 0)) || !PyTuple_CheckExact(aux) ||
        PyTuple_GET_SIZE(aux) != at + 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(aux, at + 1))) {
        return 0;
    }
    PyObject *ch = PyTuple_GET_ITEM(res, 0), *uaux = PyTuple_GET_ITEM(res, 1);
    PyObject *keys = PyTuple_GET_ITEM(aux, at + 1);
    if (PyObject_Hash(uaux) == -1) {
        PyErr_Clear(); /* the general path reports it, with the path */
        return 0;
    }
    Py_ssize_t n = PyDict_GET_SIZE(ch);
    if (n != arity) {
        return 2;
    }
    int eq = PyObject_RichCompareBool(uaux, PyTuple_GET_ITEM(aux, at), Py_EQ);
    if (eq <= 0) {
        return eq < 0 ? -1 : 2;
    }
    if (PyTuple_GET_SIZE(keys) != n) {
        return 2;
    }
    PyObject *vals = PyTuple_New(n), *key, *val;
    if (vals == NULL) {
        return -1;
    }
    Py_ssize_t pos = 0, k = 0;
    int same = 1; /* every key is the node's own object: nothing to call */
    while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
        if (key != PyTuple_GET_ITEM(keys, k)) {
            same = 0;
        }
        Py_INCREF(val);
        PyTuple_SET_ITEM(vals, k, val);
        k++;
    }
    PyObject *mine = NULL;
    if (!same) {
        /* a key's __eq__ may change the dict: compare a copy of its keys */
        mine = PyTuple_New(n);
        if (mine == NULL) {
            Py_DECREF(vals);
            return -1;
        }
        pos = k = 0;
        while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
            Py_INCREF(key);
            PyTuple_SET_ITEM(mine, k, key);
            k++;
        }
        for (k = 0; k < n; k++) {
            eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(mine, k), PyTuple_GET_ITEM(keys, k),
                                          Py_EQ);
            if (eq <= 0) {
                Py_DECREF(mine);
                Py_DECREF(vals);
                return eq < 0 ? -1 : 2;
            }
        }
    }
    Py_XDECREF(mine);
    *children = vals;
    Py_INCREF(keys);
    *names = keys;
    *keymode = KM_MAP;
    return 1;
}

/* The plan for an exact type in flatten_up_to (made when first met in the
 * call, after the lists being read are copied: it may run code). */
static TypeEntry *
up_plan(Up *u, Ctx *c, PyTypeObject *ot)
{
    TypeEntry *e = tc_find(&c->types, ot);
    return e != NULL ? e : class_entry(c, u->s, ot);
}

/* A dataclass or attrs instance whose spec node has only leaves below it and
 * every field set: append its field values to out. Returns 1 done, 0 when
 * match() must decide, -1 on error (a mismatch included). */
static int
record_leaves(Up *u, Ctx *c, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj,
              Vec *out)
{
    /* the lists being read are copied (stack_freeze) only before what may
     * run code: making a plan, comparing aux, a getattr in record_read */
    TypeEntry *e = up_plan(u, c, Py_TYPE(obj));
    if (e == NULL) {
        return -1;
    }
    if (e->plan != (kind == K_DATACLASS ? PLAN_DATACLASS : PLAN_ATTRS) || e->info == NULL) {
        return 0;
    }
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    PyObject *names = PyTuple_GET_ITEM(e->info, 0);
    if (PyTuple_GET_SIZE(names) != arity) {
        return 0;
    }
    if (aux != e->info) {
        if (stack_freeze(u->s) < 0) {
            return -1;
        }
        int eq = PyObject_RichCompareBool(aux, e->info, Py_EQ);
        if (eq <= 0) {
            return eq;
        }
    }
    PyObject *vals[32];
    Py_ssize_t absent;
    if (e->reads == NULL || arity > 32) {
        return 0;
    }
    int read = record_read(obj, e->reads, names, vals, &absent, u->s);
    if (read != 1) {
        return read == 2 ? 0 : -1; /* 2: match() has the pure engine decide */
    }
    if (absent) {
        /* an unset field: its aux differs from the spec's */
        for (Py_ssize_t j = 0; j < arity; j++) {
            Py_XDECREF(vals[j]);
        }
        return mismatch(u, node, obj);
    }
    if (vec_reserve(out, arity) < 0) {
        for (Py_ssize_t j = 0; j < arity; j++) {
            Py_DECREF(vals[j]);
        }
        return -1;
    }
    /* the new references move into out */
    memcpy(out->v + out->n, vals, arity * sizeof(PyObject *));
    out->n += arity;
    return 1;
}

/* New references to src[j] into out for j = 0, 1, ... while nodes[i + j] is
 * the leaf node, skipping each src[j] that is None where nodes[i + j] is the
 * None node, for j < n and i + j < len(nodes): how many of src were taken, or
 * -1 on failure. Leaves of the spec take any value, and None is compared by
 * identity: no user code runs. */
static inline Py_ssize_t
take_leaves(Vec *out, PyObject *const *src, Py_ssize_t n, PyObject *nodes, Py_ssize_t i)
{
    Py_ssize_t nn = PyTuple_GET_SIZE(nodes);
    PyObject *const *nd = ((PyTupleObject *)nodes)->ob_item + i;
    if (n <= 0 || i >= nn || (!IS_LEAF_NODE(nd[0]) && (nd[0] != NONE_NODE || src[0] != Py_None))) {
        return 0;
    }
    Py_ssize_t m = n < nn - i ? n : nn - i;
    if (m == 1) {
        /* as the leaf of [tree, leaf] */
        return nd[0] == NONE_NODE ? 1 : emit(out, src[0]) < 0 ? -1 : 1;
    }
    if (vec_reserve(out, m) < 0) {
        return -1;
    }
    PyObject **dst = out->v + out->n;
    Py_ssize_t j = 0;
    while (j < m && IS_LEAF_NODE(nd[j])) { /* the common case: leaves alone */
        Py_INCREF(src[j]);
        dst[j] = src[j];
        j++;
    }
    Py_ssize_t k = j; /* then leaves and Nones */
    for (; j < m; j++) {
        if (IS_LEAF_NODE(nd[j])) {
            Py_INCREF(src[j]);
            dst[k++] = src[j];
        }
        else if (nd[j] != NONE_NODE || src[j] != Py_None) {
            break;
        }
    }
    out->n += k;
    return j;
}

/* nodes[i .. i + n) are all the shared leaf node */
static inline int
leaf_run(PyObject *nodes, Py_ssize_t i, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!IS_LEAF_NODE(PyTuple_GET_ITEM(nodes, i + j))) {
            return 0;
        }
    }
    return 1;
}

/* When nodes[i .. i + n) are all the shared leaf or None node, how many are
 * the None node; else -1. */
static inline Py_ssize_t
leaf_or_none_run(PyObject *nodes, Py_ssize_t i, Py_ssize_t n)
{
    Py_ssize_t nones = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *nd = PyTuple_GET_ITEM(nodes, i + j);
        if (!IS_LEAF_NODE(nd)) {
            if (nd != NONE_NODE) {
                return -1;
            }
            nones++;
        }
    }
    return nones;
}

/* A dict node with arity (more than 32) leaves at nodes[i ..) and as many
 * keys, matched by obj,
 * an exact dict whose insertion order big_orders has for the node's keys, or
 * an exact OrderedDict whose keys are the node's own key objects in its order
 * and its dict's (odict_links): its values appended to out in one pass, with
 * no tuple of them made and no frame. Returns 1 done, 0 when match() must
 * decide, -1 on error. Runs no code: nothing can change obj while it is read. */
static int
big_dict_leaves(PkState *st, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj,
                PyObject *nodes, Py_ssize_t i, Vec *out)
{
    PyObject *keys = PyTuple_GET_ITEM(node, 3);
    PyTypeObject *want = kind == K_DICT ? &PyDict_Type : (PyTypeObject *)OrderedDict_t;
    if (Py_TYPE(obj) != want || (kind != K_DICT && READ_SNAPSHOTS) || !PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != arity ||
        PyDict_GET_SIZE(obj) != arity || !leaf_run(nodes, i, arity)) {
        return 0;
    }
    if (vec_reserve(out, arity) < 0) {
        return -1;
    }
    PyObject **vals = out->v + out->n;
    if (kind == K_DICT) {
        if (!big_dict_values(st, obj, keys, vals)) {
            return 0;
        }
    }
    else {
        Py_ssize_t pos = 0, j = 0;
        PyObject *k, *v;
#if DICT_READS
        /* an OrderedDict's dict is a dict's struct: its table read in place */
        PyObject **p;
        Py_ssize_t step;
        if (dict_table(obj, &p, &step)) {
            for (; j < arity && p[0] == PyTuple_GET_ITEM(keys, j); j++, p += step) {
                vals[j] = p[1];
            }
        }
        else
#endif
            while (j < arity && PyDict_Next(obj, &pos, &k, &v) &&
                   k == PyTuple_GET_ITEM(keys, j)) {
                vals[j++] = v;
            }
        if (j < arity || odict_in_dict_order(obj) != 1) {
            return 0;
        }
    }
    for (Py_ssize_t j = 0; j < arity; j++) {
        Py_INCREF(vals[j]);
    }
    out->n += arity;
    return 1;
}

/* The leaves of obj up to the spec's nodes, appended to out (the caller has
 * set up u, c and an empty s; s is empty again on success). */
static int
up_to_into(PyObject *nodes, PyObject *obj, Vec *out, Up *u, Ctx *c, Stack *s)
{
    Py_ssize_t nn = PyTuple_GET_SIZE(nodes), i = 0;
    Py_INCREF(obj);
    for (;;) {
        if (i >= nn) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: the nodes end early");
            goto error;
        }
        PyObject *node = PyTuple_GET_ITEM(nodes, i++);
        int kind;
        Py_ssize_t arity;
        if (node_parts(node, &kind, &arity) < 0) {
            goto error;
        }
        if (kind == K_LEAF) {
            if (emit(out, obj) < 0) {
                goto error;
            }
        }
        else if (kind == K_NONE && obj == Py_None) {
            /* nothing to take */
        }
        else {
            PyObject *children = NULL, *names = NULL;
            int keymode, live;
            Py_ssize_t nones;
#if READ_SNAPSHOTS
            /* a caller's list or dict read from a snapshot, taken under its
             * lock (an OrderedDict's, a dict subclass's: the pure engine's) */
            if (PyList_CheckExact(obj) || PyDict_CheckExact(obj)) {
                PyObject *copy = PyList_CheckExact(obj) ? PyList_GetSlice(obj, 0, PY_SSIZE_T_MAX)
                                                        : PyDict_Copy(obj);
                if (copy == NULL) {
                    goto error;
                }
                Py_SETREF(obj, copy);
            }
#endif
            if (kind == K_DICT && arity <= 32 && i + arity <= nn && PyDict_CheckExact(obj) &&
                PyDict_GET_SIZE(obj) == arity && (nones = leaf_or_none_run(nodes, i, arity)) >= 0) {
                /* a dict of leaves (and None) with str or int keys: one pass,
                 * nothing to visit */
                PyObject *keys = PyTuple_GET_ITEM(node, 3), *vals[32];
                Py_ssize_t j = 0;
                if (PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == arity) {
                    if (dict_same_keys(obj, keys, arity, vals)) {
                        j = arity;
                    }
                    for (; j < arity; j++) {
                        PyObject *k = PyTuple_GET_ITEM(keys, j);
                        if (!PyUnicode_CheckExact(k) ||
                            (vals[j] = PyDict_GetItemWithError(obj, k)) == NULL) {
                            if (PyErr_Occurred()) {
                                goto error;
                            }
                            break;
                        }
                    }
                }
                if (j == arity && nones == 0) {
                    if (vec_extend(out, vals, arity) < 0) {
                        goto error;
                    }
                    i += arity;
                    goto next;
                }
                if (j == arity) {
                    Py_ssize_t had = out->n, k = take_leaves(out, vals, arity, nodes, i);
                    if (k < 0) {
                        goto error;
                    }
                    if (k == arity) {
                        i += arity;
                        goto next;
                    }
                    /* a value that is not None at a None node: match() and
                     * the frames below raise the mismatch with its path; out
                     * is left as it was all the same */
                    while (out->n > had) {
                        Py_DECREF(out->v[--out->n]); /* the dict holds each */
                    }
                }
            }
            if ((kind == K_DICT || kind == K_ORDEREDDICT) && arity > 32 && i + arity <= nn) {
                /* a large dict of leaves (a state_dict): its values straight into out */
                int r = big_dict_leaves(c->st, kind, arity, node, obj, nodes, i, out);
                if (r < 0) {
                    goto error;
                }
                if (r == 1) {
                    i += arity;
                    goto next;
                }
            }
            if ((kind == K_DATACLASS || kind == K_ATTRS) && arity <= 32 && i + arity <= nn &&
                (PyObject *)Py_TYPE(obj) == PyTuple_GET_ITEM(node, 1) && !PyDict_Check(obj) &&
                leaf_run(nodes, i, arity)) {
                /* a record of leaves, every field set: its values, nothing to visit */
                int r = record_leaves(u, c, kind, arity, node, obj, out);
                if (r < 0) {
                    goto error;
                }
                if (r == 1) {
                    i += arity;
                    goto next;
                }
            }
            if (kind != K_TUPLE && kind != K_LIST && kind != K_NONE && kind != K_DICT &&
                kind != K_NAMEDTUPLE && stack_freeze(s) < 0) {
                goto error;
            }
            if (match(u, c, kind, arity, node, obj, &children, &names, &keymode, &live) < 0) {
                goto error;
            }
            Py_ssize_t nch = PyTuple_Check(children) ? PyTuple_GET_SIZE(children)
                                                      : PyList_GET_SIZE(children);
            if (nch) {
                /* the leading children that are leaves of the spec are taken now;
                 * a frame reads the rest, if any */
                Py_ssize_t k = take_leaves(out, seq_items(children), nch, nodes, i);
                if (k == nch || k < 0) {
                    Py_DECREF(children);
                    Py_XDECREF(names);
                    if (k < 0) {
                        goto error;
                    }
                }
                else if (stack_push(s, obj, children, names, keymode, live, 0) < 0) {
                    goto error;
                }
                else {
                    s->v[s->n - 1].pos = k;
                }
                i += k;
            }
            else {
                Py_DECREF(children);
                Py_XDECREF(names);
            }
        }
    next:
        Py_CLEAR(obj);
        Frame *fr;
        int more;
        while ((more = stack_unread(s, &fr)) > 0) {
            Py_ssize_t k =
                take_leaves(out, seq_items(fr->children) + fr->pos, fr->n - fr->pos, nodes, i);
            if (k < 0) {
                goto error;
            }
            fr->pos += k;
            i += k;
            if (fr->pos == fr->n) {
                continue;
            }
            Py_ssize_t at;
            if ((obj = frame_next(fr, &at)) == NULL) {
                goto error;
            }
            break;
        }
        if (more < 0) {
            goto error;
        }
        if (obj == NULL) {
            break;
        }
    }
    return 0;
error:
    Py_XDECREF(obj);
    return -1;
}

/* What one flatten_up_to call (of one tree or of many) holds. */
typedef struct {
    PyObject *nodes; /* the spec's, strong */
    Py_ssize_t nleaves;
    Stack s;
    Ctx c;
    Up u;
} UpCall;

static int
up_to_setup(UpCall *call, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
            const char *usage)
{
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    PyObject *orders;
    if (spec_parts(args[0], &call->nodes, &orders, &call->nleaves) < 0) {
        return -1;
    }
    stack_init(&call->s, pk_state(self));
    ctx_init(&call->c, pk_state(self), Py_None, NULL, WALK_SPEC); /* cannot fail without rules */
    call->u.s = &call->s;
    call->u.label = nargs > 2 ? args[2] : s_the_spec;
    call->u.other = nargs > 3 ? args[3] : s_the_tree;
    Py_INCREF(call->u.label);
    Py_INCREF(call->u.other);
    Py_INCREF(call->nodes);
    return 0;
}

static void
up_to_clear(UpCall *call)
{
    Py_DECREF(call->nodes);
    Py_XDECREF(call->u.label);
    Py_XDECREF(call->u.other);
    stack_clear(&call->s);
    ctx_clear(&call->c);
}

PK_SHARED PyObject *
sp_flatten_up_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    UpCall call;
    if (up_to_setup(&call, self, args, nargs,
                    "flatten_up_to(spec, tree, label='the spec', other='the tree') takes 2 to 4 "
                    "arguments") < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    Vec out;
    vec_init(&out);
    Py_ssize_t nn = PyTuple_GET_SIZE(call.nodes), nleaves = call.nleaves;
    /* a spec has no more leaves than nodes */
    if ((nleaves <= VEC_INLINE || vec_reserve(&out, nleaves < nn ? nleaves : nn) == 0) &&
        up_to_into(call.nodes, args[1], &out, &call.u, &call.c, &call.s) == 0) {
        result = vec_to_list(&out);
    }
    vec_clear(&out);
    up_to_clear(&call);
    return result;
}

/* flatten_up_to_columns(spec, trees): flatten_up_to of each tree, as one list
 * per leaf of the spec: columns[j][k] is leaf j of trees[k]. */
PK_SHARED PyObject *
sp_flatten_up_to_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    UpCall call;
    if (up_to_setup(&call, self, args, nargs,
                    "flatten_up_to_columns(spec, trees, label='the spec', other='the tree') "
                    "takes 2 to 4 arguments") < 0) {
        return NULL;
    }
    Py_ssize_t nleaves = call.nleaves;
    PyObject *columns = NULL;
    if (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])) {
        PyObject *ok = PyObject_CallOneArg(py_refuse_trees, args[1]); /* a str, bytes, mapping */
        if (ok == NULL) {
            up_to_clear(&call);
            return NULL;
        }
        Py_DECREF(ok);
    }
    /* a tuple of its own: user code run while flattening cannot change it */
    PyObject *trees = PySequence_Tuple(args[1]);
    Vec out;
    vec_init(&out);
    if (trees == NULL || (columns = PyList_New(nleaves)) == NULL) {
        goto error;
    }
    Py_ssize_t ntrees = PyTuple_GET_SIZE(trees);
    for (Py_ssize_t j = 0; j < nleaves; j++) {
        PyObject *col = PyList_New(ntrees);
        if (col == NULL) {
            goto error;
        }
        PyList_SET_ITEM(columns, j, col);
    }
    for (Py_ssize_t k = 0; k < ntrees; k++) {
        if (up_to_into(call.nodes, PyTuple_GET_ITEM(trees, k), &out, &call.u, &call.c,
                       &call.s) < 0) {
            goto error;
        }
        if (out.n != nleaves) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: num_leaves does not match");
            goto error;
        }
        for (Py_ssize_t j = 0; j < nleaves; j++) {
            /* moves the reference: the list item was NULL */
            PyList_SET_ITEM(PyList_GET_ITEM(columns, j), k, out.v[j]);
        }
        out.n = 0;
    }
    vec_clear(&out);
    Py_DECREF(trees);
    up_to_clear(&call);
    return columns;
error:
    vec_clear(&out);
    Py_XDECREF(trees);
    Py_XDECREF(columns);
    up_to_clear(&call);
    return NULL;
}
