/* _classify.c: what a value is, as _pure.classify says.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   ctx_init, known_leaf the per-call context: is_leaf, rules, the type
 *                        cache of class plans (_class_plans.c)
 *   seq_node             tuple and list nodes, kept across calls by arity
 *   classify             a value: 0 for a leaf, 1 for a node, with its node,
 *                        children and keys in a Found
 *   classify_odict,      exact OrderedDicts of str or int keys in their dict's
 *   odict_items,         order, read in one pass (also by flatten_up_to);
 *   odict_same_order     whether an OrderedDict's own order is its dict's
 *   classify_*_dict,     dicts: small ones sorted in place (with a memo of
 *   dict_order           recent key orders), large ones read by the order of
 *                        big_orders when their keys are the same objects in the
 *                        same order as a recent one; the insertion order when
 *                        it differs
 *   big_orders,          large dicts' key orders remembered across calls (also
 *   key_places           read by _unflatten.c), each key's place by identity
 *   (dict and UserDict subclasses: _mapping_kind.c)
 *   record_fields,       records' fields, and what __tree_flatten__ or a rule
 *   user_node            returned; record_view, a record that is a dict: its
 *                        dict view, each key's field found by field_named
 *                        (also read by _unflatten.c)
 * Anything rare goes to _pure.classify (classify_python).
 * Calls: _class_plans.c (class_entry), _mapping_kind.c (mapping_classify),
 * _fast_dict_reads.c (dict_table), _fast_split_values.c, _fast_odict_links.c, _stack.c.
 * Called by _flatten.c and _up_to.c.
 */

#include "_core.h"

/* Drop the references f->direct holds, if it holds any. */
PK_SHARED void
release_direct(Found *f)
{
    if (f->direct_owned) {
        for (Py_ssize_t i = 0; i < f->direct_n; i++) {
            Py_DECREF(f->direct[i]);
        }
        f->direct_owned = 0;
    }
}

/* The node of a tuple or list; those of fewer than SHARED_SEQ_NODES
 * children are made once and kept in the module's state (they hold only ints
 * and None), shared by every spec. New reference. */
static PyObject *
seq_node(PkState *st, int kind, Py_ssize_t n)
{
    if (n >= SHARED_SEQ_NODES || !KEEP_ACROSS_CALLS) {
        return make_node(kind, Py_None, n, Py_None);
    }
    PyObject **slot = &st->seq_nodes[kind == K_LIST][n];
    if (*slot == NULL) {
        /* (the allocation may collect garbage, whose finalizers may flatten
         * and fill the slot meanwhile) */
        PyObject *made = make_node(kind, Py_None, n, Py_None);
        if (made == NULL) {
            return NULL;
        }
        if (*slot == NULL) {
            *slot = made;
        }
        else {
            Py_DECREF(made);
        }
    }
    return Py_NewRef(*slot);
}

static PyTypeObject *const atom_types[6] = {
    &PyLong_Type, &PyFloat_Type, &PyUnicode_Type, &PyBytes_Type, &PyBool_Type, &PyComplex_Type,
};

PK_SHARED int
ctx_init(Ctx *c, PkState *st, PyObject *is_leaf, PyObject *rules, WalkMode mode)
{
    /* no memset: the type cache's and the nodes' storage is set when used */
    c->types.v = NULL;
    c->types.n = c->types.cap = 0;
    c->rules = NULL;
    c->pycache = NULL;
    c->last_leaf = NULL;
    c->dict_misses = 0;
    c->st = st;
    c->leaf_node = NULL;
    c->is_leaf = is_leaf == Py_None ? NULL : is_leaf;
    c->mode = mode;
    c->path_keys = NULL;
    if (rules != NULL && rules != Py_None) {
        if (!PyDict_CheckExact(rules)) {
            PyErr_SetString(PyExc_TypeError, "rules must be a dict (see pytree_kit._kinds.check_rules)");
            return -1;
        }
        if (PyDict_GET_SIZE(rules)) {
            c->rules = rules;
        }
    }
    for (int i = 0; i < 6; i++) {
        int in_rules = 0;
        if (c->rules != NULL) {
            in_rules = PyDict_Contains(c->rules, (PyObject *)atom_types[i]);
            if (in_rules < 0) {
                return -1;
            }
        }
        c->atom_leaf[i] = !in_rules;
    }
    /* strong: a LeafIter's walk may go on in another thread than this one,
     * whose thread state (and its dict) may be gone by then */
    c->leaf_node = Py_NewRef(mode == WALK_LEAVES ? LEAF_NODE : thread_leaf_node());
    return 0;
}

PK_SHARED void
ctx_clear(Ctx *c)
{
    tc_clear(&c->types);
    Py_CLEAR(c->pycache);
    Py_CLEAR(c->leaf_node);
}

/* Is a value of type t a leaf by its type alone, with no user code to run? */
PK_SHARED_INLINE int
known_leaf(Ctx *c, PyTypeObject *t)
{
    if (t == c->last_leaf) {
        return 1;
    }
    if (t == &PyList_Type || t == &PyDict_Type || t == &PyTuple_Type) {
        return 0; /* classify decides: a rule may name them */
    }
    for (int i = 0; i < 6; i++) {
        if (t == atom_types[i]) {
            if (c->atom_leaf[i]) {
                c->last_leaf = t;
            }
            return c->atom_leaf[i];
        }
    }
    TypeEntry *e = tc_find(&c->types, t);
    if (e != NULL && e->plan == PLAN_LEAF) {
        c->last_leaf = t;
        return 1;
    }
    return 0;
}

static int
classify_python(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    /* _pure.classify(obj, t, rules, stack, cache) */
    if (c->pycache == NULL && (c->pycache = PyDict_New()) == NULL) {
        return -1;
    }
    PyObject *st = stack_py(s);
    if (st == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallFunctionObjArgs(py_classify, obj, (PyObject *)Py_TYPE(obj),
                                                 c->rules ? c->rules : Py_None, st, c->pycache,
                                                 NULL);
    Py_DECREF(st);
    if (res == NULL) {
        return -1;
    }
    if (res == Py_None) {
        Py_DECREF(res);
        return 0;
    }
    if (!PyTuple_CheckExact(res) || PyTuple_GET_SIZE(res) != 4) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "pytree_kit: classify returned a bad value");
        return -1;
    }
    PyObject *node = PyTuple_GET_ITEM(res, 0);
    PyObject *children = PyTuple_GET_ITEM(res, 1);
    PyObject *names = PyTuple_GET_ITEM(res, 3);
    long km = PyLong_AsLong(PyTuple_GET_ITEM(res, 2));
    if (km == -1 && PyErr_Occurred()) {
        Py_DECREF(res);
        return -1;
    }
    if (PyTuple_Check(children) || PyList_Check(children)) {
        Py_INCREF(children);
    }
    else {
        children = PySequence_Tuple(children);
        if (children == NULL) {
            Py_DECREF(res);
            return -1;
        }
    }
    f->children = children;
    f->node = node;
    Py_INCREF(node);
    f->names = names == Py_None ? NULL : names;
    Py_XINCREF(f->names);
    f->keymode = (int)km;
    f->live = 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    f->dict_kind = kind == K_DICT || kind == K_DEFAULTDICT;
    Py_DECREF(res);
    if (f->dict_kind && c->mode != WALK_LEAVES) {
        /* its insertion order from the one read classify made of it (left in
         * the call's cache), not from a second read: _pure.dict_order */
        PyObject *order = PyObject_CallFunctionObjArgs(py_dict_order, node, obj, c->pycache, NULL);
        if (order == NULL) {
            Py_CLEAR(f->node);
            Py_CLEAR(f->children);
            Py_CLEAR(f->names);
            return -1;
        }
        f->order = order == Py_None ? (Py_DECREF(order), NULL) : order;
        f->order_known = 1;
    }
    return 1;
}

/* What __tree_flatten__ or a rule returned, as _pure._user_children validates
 * it. The common shape, (list, tuple or dict children, hashable aux), is read
 * here; anything else (optree's (children, aux, entries) included) goes to
 * the pure helper. On success sets *children (a tuple), *tail (the node's aux
 * data after the rule: (aux, keys) or (aux, None, entries); only when tail is
 * not NULL) and *names (the keys or entries, or None), all strong references. */
PK_SHARED int
user_result(Ctx *c, Stack *s, PyObject *res, PyTypeObject *t, PyObject *helper,
            PyObject **children, PyObject **tail, PyObject **names, int *keymode)
{
    if (PyTuple_CheckExact(res) && PyTuple_GET_SIZE(res) == 2) {
        PyObject *ch = PyTuple_GET_ITEM(res, 0);
        PyObject *ax = PyTuple_GET_ITEM(res, 1);
        int seq = PyTuple_CheckExact(ch) || PyList_CheckExact(ch);
        if (seq || PyDict_CheckExact(ch)) {
            Py_hash_t h = PyObject_Hash(ax);
            if (h != -1 && seq) {
                *children = PySequence_Tuple(ch);
                if (*children == NULL) {
                    return -1;
                }
                if (tail != NULL && (*tail = PyTuple_Pack(2, ax, Py_None)) == NULL) {
                    Py_CLEAR(*children);
                    return -1;
                }
                Py_INCREF(Py_None);
                *names = Py_None;
                *keymode = KM_SEQ;
                return 0;
            }
            if (h != -1) {
                /* a dict: its keys name the children, in insertion order
                 * (nothing below runs Python code, so the dict cannot change;
                 * READ_SNAPSHOTS: another thread could, and a snapshot is read) */
#if READ_SNAPSHOTS
                PyObject *snap = PyDict_Copy(ch);
                if (snap == NULL) {
                    return -1;
                }
                ch = snap;
#endif
                Py_ssize_t n = PyDict_GET_SIZE(ch), pos = 0, k = 0;
                PyObject *kt = PyTuple_New(n), *vt = PyTuple_New(n), *key, *val;
                if (kt == NULL || vt == NULL) {
                    Py_XDECREF(kt);
                    Py_XDECREF(vt);
#if READ_SNAPSHOTS
                    Py_DECREF(snap);
#endif
                    return -1;
                }
                while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
                    Py_INCREF(key);
                    Py_INCREF(val);
                    PyTuple_SET_ITEM(kt, k, key);
                    PyTuple_SET_ITEM(vt, k, val);
                    k++;
                }
#if READ_SNAPSHOTS
                Py_DECREF(snap);
#endif
                if (tail != NULL && (*tail = PyTuple_Pack(2, ax, kt)) == NULL) {
                    Py_DECREF(kt);
                    Py_DECREF(vt);
                    return -1;
                }
                *children = vt;
                *names = kt;
                *keymode = KM_MAP;
                return 0;
            }
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                return -1;
            }
            PyErr_Clear();
        }
    }
    PyObject *st = stack_py(s);
    if (st == NULL) {
        return -1;
    }
    PyObject *out = PyObject_CallFunctionObjArgs(helper, res, st, (PyObject *)t, NULL);
    Py_DECREF(st);
    if (out == NULL) {
        return -1;
    }
    /* (children, tail, names, mode) */
    PyObject *ch = PyTuple_GET_ITEM(out, 0);
    *children = PySequence_Tuple(ch);
    if (*children == NULL) {
        Py_DECREF(out);
        return -1;
    }
    if (tail != NULL) {
        *tail = Py_NewRef(PyTuple_GET_ITEM(out, 1));
    }
    *names = PyTuple_GET_ITEM(out, 2);
    Py_INCREF(*names);
    *keymode = (int)PyLong_AsLong(PyTuple_GET_ITEM(out, 3));
    Py_DECREF(out);
    return 0;
}

/* A RULE node's aux data: (rule, *tail). */
static PyObject *
rule_aux(PyObject *rule, PyObject *tail)
{
    Py_ssize_t n = PyTuple_GET_SIZE(tail);
    PyObject *a = PyTuple_New(n + 1);
    if (a == NULL) {
        return NULL;
    }
    Py_INCREF(rule);
    PyTuple_SET_ITEM(a, 0, rule);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(tail, i);
        Py_INCREF(x);
        PyTuple_SET_ITEM(a, i + 1, x);
    }
    return a;
}

/* The node and children of what a rule (rule != NULL) or __tree_flatten__
 * returned, res: a RULE node (rule, *tail) or a CUSTOM node (tail). */
static int
user_node(Ctx *c, Stack *s, PyObject *res, PyTypeObject *t, PyObject *rule, Found *f)
{
    PyObject *children, *tail = NULL, *names;
    int km;
    if (user_result(c, s, res, t, rule ? py_rule_result : py_custom_result, &children,
                    c->mode != WALK_LEAVES ? &tail : NULL, &names, &km) < 0) {
        return -1;
    }
    f->node = NULL;
    if (c->mode != WALK_LEAVES) {
        PyObject *a = rule ? rule_aux(rule, tail) : Py_NewRef(tail);
        if (a != NULL) {
            f->node = make_node(rule ? K_RULE : K_CUSTOM, (PyObject *)t,
                                PyTuple_GET_SIZE(children), a);
            Py_DECREF(a);
        }
        if (f->node == NULL) {
            Py_DECREF(children);
            Py_DECREF(tail);
            Py_DECREF(names);
            return -1;
        }
    }
    Py_XDECREF(tail);
    f->children = children;
    f->names = names == Py_None ? NULL : names;
    if (names == Py_None) {
        Py_DECREF(names);
    }
    f->keymode = km;
    f->live = 0;
    f->dict_kind = 0;
    return 1;
}

/* After code ran while a record's fields were read (a getattr), which may
 * have changed the instance: 1 when obj still keeps nothing outside its
 * fields (no slot set that is not a field's; every entry of its __dict__ a
 * field's), 0 when the pure engine must
 * decide, -1 on error. Looks at names only: no code runs. */
static PK_NO_INLINE int
record_recheck(PyObject *obj, const FieldReads *r, PyObject *names)
{
    Py_ssize_t found = 0;
    for (Py_ssize_t j = 0; j < r->n_slots; j++) {
        if (SLOT(obj, READS_SLOT(r, j)) != NULL) {
            return 0;
        }
    }
    if (!r->has_dict) {
        return 1;
    }
    PyObject *dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) {
        return -1;
    }
    int ok = PyDict_Check(dict);
    for (Py_ssize_t i = 0; ok && i < r->n; i++) {
        if (READS_DICT_OK(r, i) && r->code[i] <= 0) {
            /* an exact str key looked up in a dict: no code runs */
            PyObject *x = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(names, i));
            if (x == NULL && PyErr_Occurred()) {
                Py_DECREF(dict);
                return -1;
            }
            found += x != NULL;
        }
    }
    ok = ok && PyDict_GET_SIZE(dict) == found;
    Py_DECREF(dict);
    return ok;
}

/* Reads the fields of obj, a record whose class's reads are r, into v (new
 * references; NULL for an unset field, counted in *absent) as getattr
 * would, and makes sure that obj keeps no state outside them: nothing in a
 * slot that is not a field's, and nothing in its __dict__ but the fields
 * read from there. Returns 1; 2 when obj does
 * keep, or may keep, such state, for the pure engine to decide (its
 * cached_property values are not state, say) with no reference held; -1 on
 * error with none held. s, when not NULL, is frozen before anything that may
 * run code (getattr of a field that obj does not hold itself).
 *
 * The __dict__ of an instance of a class with a managed dict (3.11+) is
 * made by PyObject_GenericGetDict when it has none yet, as `vars(obj)`
 * would. */
PK_SHARED_ALWAYS_INLINE int
record_read(PyObject *obj, const FieldReads *r, PyObject *names, PyObject **v,
            Py_ssize_t *absent, Stack *s)
{
    Py_ssize_t n = r->n, stored = 0, found = 0, i = 0;
    PyObject *dict = NULL;
#if SPLIT_READS
    PyObject **split = NULL;
#endif
    int ran = 0;
    *absent = 0;
    for (Py_ssize_t j = 0; j < r->n_slots; j++) {
        if (SLOT(obj, READS_SLOT(r, j)) != NULL) {
            return 2;
        }
    }
    if (r->has_dict) {
        if ((dict = PyObject_GenericGetDict(obj, NULL)) == NULL) {
            return -1;
        }
#if READ_SNAPSHOTS
        if (PyDict_Check(dict)) {
            Py_SETREF(dict, dict_snapshot(dict));
            if (dict == NULL) {
                return -1;
            }
        }
#endif
        stored = PyDict_Check(dict) ? PyDict_GET_SIZE(dict) : n + 1;
#if SPLIT_READS
        split = split_values(dict, r);
#endif
        if (stored > n) {
            Py_XDECREF(dict);
            return 2;
        }
    }
    for (; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *x = NULL;
        Py_ssize_t code = r->code[i];
        if (code > 0) {
#if READ_SNAPSHOTS
            if ((v[i] = slot_ref(obj, code)) != NULL) {
                continue;
            }
            if (PyErr_Occurred()) {
                goto fail;
            }
#else
            x = SLOT(obj, code);
#endif
        }
#if SPLIT_READS
        else if (code < 0 && split != NULL && split_key_is(r, -1 - code, name)) {
            /* the __dict__'s value for name, or NULL where it has none */
            x = split[-1 - code];
            found += x != NULL;
        }
#endif
        else if (dict != NULL && READS_DICT_OK(r, i)) {
            /* an exact str key looked up in a dict: no code runs */
            x = PyDict_GetItemWithError(dict, name);
            if (x == NULL && PyErr_Occurred()) {
                goto fail;
            }
            found += x != NULL;
        }
        if (x != NULL) {
            Py_INCREF(x);
            v[i] = x;
            continue;
        }
        /* getattr may run code: copy the lists being read first */
        if (s != NULL && stack_freeze(s) < 0) {
            goto fail;
        }
        ran = 1;
        /* the getattr may run code that changes the instance: a values array
         * read above may be gone after it, so the rest are looked up */
#if SPLIT_READS
        split = NULL;
#endif
        if ((v[i] = PyObject_GetAttr(obj, name)) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                goto fail;
            }
            PyErr_Clear();
            (*absent)++;
        }
    }
    Py_XDECREF(dict);
    /* what getattr ran may have changed the instance: counted again */
    int kept = ran ? record_recheck(obj, r, names)
                   : !r->has_dict || found == stored;
    if (kept != 1) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_CLEAR(v[k]);
        }
        return kept < 0 ? -1 : 2;
    }
    return 1;
fail:
    Py_XDECREF(dict);
    for (Py_ssize_t k = 0; k < i; k++) {
        Py_CLEAR(v[k]);
    }
    return -1;
}

/* Drops the values record_read gave: the tuple children holds them, or, when
 * it is NULL, the n of v (NULL for an unset field). */
static void
release_values(PyObject *children, PyObject **v, Py_ssize_t n)
{
    if (children != NULL) {
        Py_DECREF(children);
        return;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(v[k]);
    }
}

/* The index of the last of names[0 .. n) equal to k, an exact str (as
 * dict(zip(names, ...))[k] finds it), or -1. Runs no code: a name that is
 * not an exact str is passed over, as it cannot equal k without its own ==;
 * strs of other lengths are not compared. */
PK_SHARED Py_ssize_t
field_named(PyObject *names, Py_ssize_t n, PyObject *k)
{
    for (Py_ssize_t j = n - 1; j >= 0; j--) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (name == k ||
            (PyUnicode_CheckExact(name) &&
             (!STR_READY(name) || !STR_READY(k) ||
              PyUnicode_GET_LENGTH(name) == PyUnicode_GET_LENGTH(k)) &&
             PyUnicode_Compare(name, k) == 0)) {
            return j;
        }
    }
    return -1;
}

/* Whether obj, an instance of OrderedDict or a subclass whose keys are all
 * exact str or all exact int, has its own order its dict's insertion order:
 * 1 or 0; -1 on error. Read from its linked list of keys where that layout
 * was validated (odict_links), else with OrderedDict's own iterator
 * (whatever a subclass's __iter__), whose lookups of such keys run no code;
 * an iterator that finds the list broken (a key that dict's own methods
 * removed) raises, as it does for the pure engine. */
static int
odict_same_order(PyObject *obj)
{
    int same = odict_in_dict_order(obj);
    if (same >= 0) {
        return same;
    }
    PyObject *it = ((PyTypeObject *)OrderedDict_t)->tp_iter(obj), *k;
    Py_ssize_t i = 0, pos = 0, n = PyDict_GET_SIZE(obj);
    same = it != NULL;
    for (; same; i++) {
        PyObject *y = PyIter_Next(it);
        if (y == NULL) {
            same = i == n;
            break;
        }
        same = i < n && PyDict_Next(obj, &pos, &k, NULL) && y == k;
        Py_DECREF(y);
    }
    Py_XDECREF(it);
    return PyErr_Occurred() ? -1 : same;
}

/* The dict view of a record that is also a dict (transformers' ModelOutput),
 * checked as _pure._record_fields checks it: each entry's key an exact str
 * naming a field (names, values v, every field set) whose value is the
 * entry's value itself; and, for an OrderedDict, its own order its dict's
 * insertion order (as it is unless move_to_end reordered it). Returns 1, with
 * *keys (when keys is not NULL) a new tuple of the entries' keys in that
 * order; 2 when the pure engine must decide (it raises, or reads the
 * reordered keys); -1 on error. No Python code runs: the entries are read
 * from the dict's own table, and an OrderedDict's order by its own iterator,
 * whose lookups of exact str keys run none. */
static PK_NO_INLINE int
record_view_held(PyObject *obj, PyObject *names, PyObject *const *v, PyObject **keys)
{
    Py_ssize_t m = PyDict_GET_SIZE(obj), n = PyTuple_GET_SIZE(names), pos = 0, i = 0;
    PyObject *k, *x, *ks = NULL;
    if (keys != NULL && (ks = PyTuple_New(m)) == NULL) {
        return -1;
    }
    while (i < m && PyDict_Next(obj, &pos, &k, &x)) {
        Py_ssize_t j = PyUnicode_CheckExact(k) ? field_named(names, n, k) : -1;
        if (j < 0 || v[j] != x) {
            goto other;
        }
        if (ks != NULL) {
            PyTuple_SET_ITEM(ks, i, Py_NewRef(k));
        }
        i++;
    }
    if (i != m) {
        goto other;
    }
    int order =
        PyObject_TypeCheck(obj, (PyTypeObject *)OrderedDict_t) ? odict_same_order(obj) : 1;
    if (order <= 0) {
        if (order < 0) {
            Py_XDECREF(ks);
            return -1;
        }
        goto other;
    }
    if (keys != NULL) {
        *keys = ks;
    }
    return 1;
other:
    Py_XDECREF(ks);
    return 2;
}

/* record_view_held, under the dict's own lock where the GIL can be off
 * (READ_SNAPSHOTS: its table and an OrderedDict's links read as one state) */
static int
record_view(PyObject *obj, PyObject *names, PyObject *const *v, PyObject **keys)
{
    int r;
#if READ_SNAPSHOTS
    Py_BEGIN_CRITICAL_SECTION(obj);
    r = record_view_held(obj, names, v, keys);
    Py_END_CRITICAL_SECTION();
#else
    r = record_view_held(obj, names, v, keys);
#endif
    return r;
}

/* _pure._record_fields for the common case: no static field, and, for a
 * record that is a dict, every field set.
 * Returns 1 with f set, or 2 when the pure engine should do it. With a
 * stack (flatten and leaves), a record whose fields are all leaves by their
 * type gives them as f->direct (strong references, f->direct_owned), with no
 * children to visit. */
PK_SHARED int
record_fields(Ctx *c, Stack *s, PyObject *obj, TypeEntry *e, int kind, Found *f, int want_node)
{
    if (e->info == NULL || e->reads == NULL) {
        return 2;
    }
    PyObject *full = e->info; /* (names, (), (), None) */
    PyObject *names = PyTuple_GET_ITEM(full, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(names), absent = 0;
    int view = PyDict_Check(obj);
    /* the values: in f->direct when they fit, else in a tuple */
    PyObject *children = NULL, **v = f->direct;
    if (s == NULL || n > (Py_ssize_t)(sizeof(f->direct) / sizeof(f->direct[0]))) {
        if ((children = spare_tuple(c->st, n)) == NULL) {
            return -1;
        }
        v = ((PyTupleObject *)children)->ob_item;
    }
    int read = record_read(obj, e->reads, names, v, &absent, s);
    if (read != 1) {
        Py_XDECREF(children); /* its items are cleared */
        return read;
    }
    f->node = NULL;
    f->keymode = KM_ATTR;
    f->live = 0;
    f->dict_kind = 0;
    if (view) {
        PyObject *keys = NULL;
        int r = absent ? 2 : record_view(obj, names, v, want_node ? &keys : NULL);
        if (r == 1 && want_node) {
            PyObject *aux = PyTuple_Pack(4, names, empty_tuple, empty_tuple, keys);
            Py_DECREF(keys);
            f->node = aux ? make_node(kind, (PyObject *)e->type, n, aux) : NULL;
            Py_XDECREF(aux);
            r = f->node ? 1 : -1;
        }
        if (r != 1) {
            release_values(children, v, n);
            return r;
        }
    }
    else if (absent == 0 && want_node) {
        if (e->node == NULL) {
            e->node = make_node(kind, (PyObject *)e->type, n, full);
        }
        if (e->node == NULL) {
            goto fail;
        }
        Py_INCREF(e->node);
        f->node = e->node;
    }
    if (absent == 0 && children == NULL && n > 0 && c->is_leaf == NULL && c->mode != WALK_PATHS) {
        Py_ssize_t i = 0;
        while (i < n && known_leaf(c, Py_TYPE(v[i]))) {
            i++;
        }
        int held = i == n ? stack_holds(s, obj) : 1;
        if (held < 0) {
            goto fail;
        }
        if (!held) {
            f->direct_n = n;
            f->direct_owned = 1;
            Py_INCREF(empty_tuple);
            f->children = empty_tuple;
            Py_INCREF(names);
            f->names = names;
            return 1;
        }
    }
    if (children == NULL) {
        if ((children = spare_tuple(c->st, n)) == NULL) {
            goto fail;
        }
        if (n) {
            memcpy(((PyTupleObject *)children)->ob_item, v, n * sizeof(PyObject *));
        }
    }
    if (absent == 0) {
        f->children = children;
        Py_INCREF(names);
        f->names = names;
        return 1;
    }
    /* some fields are unset: they go to the aux data */
    PyObject *present = PyTuple_New(n - absent), *vals = PyTuple_New(n - absent);
    PyObject *gone = PyTuple_New(absent), *aux = NULL;
    if (present == NULL || vals == NULL || gone == NULL) {
        goto fail_absent;
    }
    for (Py_ssize_t i = 0, p = 0, g = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *x = PyTuple_GET_ITEM(children, i);
        Py_INCREF(name);
        if (x == NULL) {
            PyTuple_SET_ITEM(gone, g++, name);
        }
        else {
            PyTuple_SET_ITEM(present, p, name);
            Py_INCREF(x);
            PyTuple_SET_ITEM(vals, p++, x);
        }
    }
    if (want_node) {
        aux = PyTuple_Pack(4, present, empty_tuple, gone, Py_None);
        if (aux == NULL) {
            goto fail_absent;
        }
        f->node = make_node(kind, (PyObject *)e->type, n - absent, aux);
        Py_DECREF(aux);
        if (f->node == NULL) {
            goto fail_absent;
        }
    }
    Py_DECREF(gone);
    Py_DECREF(children);
    f->children = vals;
    f->names = present;
    return 1;
fail_absent:
    Py_XDECREF(present);
    Py_XDECREF(vals);
    Py_XDECREF(gone);
    Py_DECREF(children);
    return -1;
fail:
    Py_CLEAR(f->node);
    release_values(children, v, n);
    return -1;
}

/* [obj[k] for k in keys[0 .. n)] for an exact dict: a new list, or NULL with
 * the KeyError obj[k] raises. */
PK_SHARED PyObject *
dict_values(PyObject *obj, PyObject **keys, Py_ssize_t n)
{
    PyObject *values = PyList_New(n);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemWithError(obj, keys[i]);
        if (v == NULL) {
            if (!PyErr_Occurred()) {
                PyObject *tup = PyTuple_Pack(1, keys[i]);
                if (tup != NULL) {
                    PyErr_SetObject(PyExc_KeyError, tup);
                    Py_DECREF(tup);
                }
            }
            Py_DECREF(values);
            return NULL;
        }
        Py_INCREF(v);
        PyList_SET_ITEM(values, i, v);
    }
    return values;
}



/* The key orders of small dicts met, across calls
 *
 * A dict with the same key objects in the same insertion order (exact str or
 * int, so their order never changes) as one met before takes its key order,
 * its keys tuple, its node and its insertion-order tuple from the memo's
 * dict_orders table (_memo.c) instead of sorting and allocating again: a
 * config, a chain or a batch of records is the same key objects call after
 * call. An entry (DictOrder) is found by a hash of its first and last keys
 * inserted and their count (its set), then by its keys; perm[i] is the
 * sorted position of the i-th key in insertion order. Only
 * classify_small_dict reads or writes an entry: after its last allocation
 * (an allocation may collect garbage, whose finalizers may flatten and
 * rewrite any entry), from references of its own, letting go of the old ones
 * last (strs, ints and tuples of them: no user code runs). The entries hold
 * their keys, nodes and orders alive, of at most SMALL_DICT keys each. */
/* misses in a row in one call after which it stops writing entries: a tree of
 * dicts made with fresh key objects never hits, and would only push out the
 * entries that serve */
#define DICT_ORDER_MISSES 64

/* The key of a dict whose keys in insertion order are ins, in the table (not 0) */
static inline uintptr_t
dict_order_key(PyObject *const *ins, Py_ssize_t n)
{
    size_t h = (size_t)n << 3;
    if (n > 0) {
        h ^= ptr_hash(ins[0]) ^ (ptr_hash(ins[n - 1]) >> 7);
    }
    return (uintptr_t)h | 1;
}

/* The entry of key whose keys are ins, in that insertion order, or NULL */
static inline DictOrder *
dict_order_find(MemoTable *t, uintptr_t key, PyObject *const *ins, Py_ssize_t n)
{
    MemoHead *set = memo_set(t, key);
    for (unsigned int w = 0; w < t->ways; w++) {
        DictOrder *m = (DictOrder *)memo_way(t, set, w);
        if (m->head.key != key || PyTuple_GET_SIZE(m->keys) != n) {
            continue;
        }
        PyObject *const *k = ((PyTupleObject *)m->keys)->ob_item;
        Py_ssize_t i = 0;
        while (i < n && k[m->perm[i]] == ins[i]) {
            i++;
        }
        if (i == n) {
            return m;
        }
    }
    return NULL;
}

/* Write keys (sorted), perm, node and order (either NULL) into the entry of
 * key (ins[0 .. n) found, else a new one), in place of what it held, which
 * is let go of last. */
static DictOrder *
dict_order_write(MemoTable *t, uintptr_t key, PyObject *const *ins, PyObject *keys,
                 const uint8_t *perm, int permuted, PyObject *node, PyObject *order)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    DictOrder *m = dict_order_find(t, key, ins, n);
    if (m == NULL) {
        m = (DictOrder *)memo_victim(t, memo_set(t, key));
    }
    DictOrder old = *m;
    m->head.key = key;
    memo_touch(t, &m->head);
    m->keys = Py_NewRef(keys);
    m->node = Py_XNewRef(node);
    m->order = Py_XNewRef(order);
    m->permuted = permuted;
    memcpy(m->perm, perm, (size_t)n);
    Py_XDECREF(old.keys);
    Py_XDECREF(old.node);
    Py_XDECREF(old.order);
    return m;
}

/* Large dicts' key orders, remembered across calls
 *
 * Flattening a dict of more than BIG_DICT keys sorts them, and reads each
 * value by its key; unflattening it in its insertion order inserts each key
 * again, growing the table on the way. The last key orders met (all exact
 * str or all exact int keys: their order, hash and equality never run user
 * code or change) are remembered in the memo's big_orders table (_memo.c),
 * by the identity of the keys:
 * the keys in insertion order, the node's keys in sorted order, where each
 * one sits in the other, and (made the second time an order is built, by
 * _unflatten.c's big_dict) a template dict in insertion order. A dict of the
 * same key objects in the same insertion order, as a state_dict is each time
 * it is flattened or rebuilt, is then read without sorting or lookups, and
 * rebuilt by copying the template. An entry is written whole, from this
 * call's own references, and lets go of the old ones last. The entries hold
 * their keys alive. */

/* a and b are tuples of the same objects in the same places */
PK_SHARED_INLINE int
same_items(PyObject *a, PyObject *b)
{
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (a == b) {
        return 1;
    }
    if (n != PyTuple_GET_SIZE(b)) {
        return 0;
    }
    PyObject **x = ((PyTupleObject *)a)->ob_item, **y = ((PyTupleObject *)b)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            return 0;
        }
    }
    return 1;
}

/* position tables of up to this many slots are on the C stack (4 KiB) */
#define PLACES_INLINE 1024

/* A key's home slot in a table of mask + 1 slots, by the key object's address. */
static inline size_t
place_slot(PyObject *k, size_t mask)
{
    return (ptr_hash(k) >> 20) & mask;
}

/* at[i] = the place of order[i] among keys[0 .. n), by identity, or -1 when
 * it is none of them (a key object given twice keeps its first place). Up to
 * 8 keys are searched in place; more through an open-addressing table of 2
 * to 4 slots per key, each 0 or 1 + a place. 0, or -1 with MemoryError. */
PK_SHARED int
key_places(PyObject *const *keys, PyObject *const *order, Py_ssize_t n, Py_ssize_t *at)
{
    if (n <= 8) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t j = 0;
            while (j < n && keys[j] != order[i]) {
                j++;
            }
            at[i] = j < n ? j : -1;
        }
        return 0;
    }
    if ((size_t)n > (size_t)INT32_MAX / 4) {
        PyErr_NoMemory();
        return -1;
    }
    size_t cap = 32;
    while (cap < (size_t)n * 2) {
        cap <<= 1;
    }
    int32_t inline_t[PLACES_INLINE];
    int32_t *t = cap <= PLACES_INLINE ? inline_t : PyMem_Malloc(cap * sizeof(int32_t));
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(t, 0, cap * sizeof(int32_t));
    size_t mask = cap - 1;
    for (Py_ssize_t j = 0; j < n; j++) {
        size_t s = place_slot(keys[j], mask);
        while (t[s] != 0 && keys[t[s] - 1] != keys[j]) {
            s = (s + 1) & mask;
        }
        if (t[s] == 0) {
            t[s] = (int32_t)j + 1;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t s = place_slot(order[i], mask);
        while (t[s] != 0 && keys[t[s] - 1] != order[i]) {
            s = (s + 1) & mask;
        }
        at[i] = (Py_ssize_t)t[s] - 1;
    }
    if (t != inline_t) {
        PyMem_Free(t);
    }
    return 0;
}

/* Whether keys (a tuple) are all exact str or all exact int, in increasing
 * order: as flatten makes a large dict node's keys, the only ones big_orders
 * may hold (flatten must never give other keys back). 1, 0, or -1 on error
 * (exact ints compare without one). */
PK_SHARED int
keys_sorted(PyObject *keys)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    int str = 1, num = 1;
    for (Py_ssize_t i = 0; i < n && (str || num); i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        str &= PyUnicode_CheckExact(k);
        num &= PyLong_CheckExact(k);
    }
    if (!(str || num)) {
        return 0;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        int lt = key_lt(PyTuple_GET_ITEM(keys, i - 1), PyTuple_GET_ITEM(keys, i), str);
        if (lt <= 0) {
            return lt;
        }
    }
    return 1;
}

/* Remember this insertion order of these keys (tuples of the same keys, each
 * order[i] being keys[at[i]]; keys as keys_sorted requires): the table's way
 * used least recently takes it, and what it held is let go of last. 0, or
 * -1 on error. */
PK_SHARED int
big_order_note(PkState *st, PyObject *keys, PyObject *order, const Py_ssize_t *at, Py_ssize_t n)
{
    if (!KEEP_ACROSS_CALLS) {
        return 0;
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)at, n * (Py_ssize_t)sizeof(Py_ssize_t));
    if (b == NULL) {
        return -1;
    }
    MemoTable *t = &st->memo.big_orders;
    PyObject *first = PyTuple_GET_ITEM(order, 0);
    BigOrder *e = (BigOrder *)memo_victim(t, memo_set(t, (uintptr_t)first));
    BigOrder old = *e;
    e->head.key = (uintptr_t)first;
    memo_touch(t, &e->head);
    e->order = Py_NewRef(order);
    e->keys = Py_NewRef(keys);
    e->at = b;
    e->dict = NULL;
    Py_XDECREF(old.order);
    Py_XDECREF(old.keys);
    Py_XDECREF(old.at);
    Py_XDECREF(old.dict);
    return 0;
}

/* The entry of the big_orders table that may hold the insertion order of obj
 * (an exact dict of more than BIG_DICT keys): of its size, starting with its
 * first key, and, when keys is given, of those sorted keys. NULL when none
 * is. */
PK_SHARED BigOrder *
big_order_for(PkState *st, PyObject *obj, PyObject *keys)
{
    Py_ssize_t n = PyDict_GET_SIZE(obj), pos = 0;
    PyObject *k, *v;
    if (!KEEP_ACROSS_CALLS || n <= BIG_DICT || (keys != NULL && PyTuple_GET_SIZE(keys) != n) ||
        !PyDict_Next(obj, &pos, &k, &v)) {
        return NULL;
    }
    MemoTable *t = &st->memo.big_orders;
    MemoHead *set = memo_set(t, (uintptr_t)k);
    for (unsigned int j = 0; j < t->ways; j++) {
        BigOrder *e = (BigOrder *)memo_way(t, set, j);
        if (e->head.key == (uintptr_t)k && PyTuple_GET_SIZE(e->order) == n &&
            (keys == NULL || same_items(e->keys, keys))) {
            memo_touch(t, &e->head);
            return e;
        }
    }
    return NULL;
}

/* The values of the exact dict obj in sorted order, borrowed into vals, when
 * its keys are order's (an entry's), in that order: one pass, each value to
 * its place at[i] (at_obj's). 1; else 0 (vals partly written). Makes nothing
 * and runs no code. */
static int
big_order_read(PyObject *obj, PyObject *order, PyObject *at_obj, PyObject **vals)
{
    Py_ssize_t n = PyTuple_GET_SIZE(order), pos = 0, i = 0;
    PyObject *k, *v, **want = ((PyTupleObject *)order)->ob_item;
    const Py_ssize_t *at = (const Py_ssize_t *)PyBytes_AS_STRING(at_obj);
    if (PyDict_GET_SIZE(obj) != n) {
        return 0;
    }
#if DICT_READS
    PyObject **p;
    Py_ssize_t step;
    if (dict_table(obj, &p, &step)) { /* the entries in place, in order */
        for (; i < n; i++, p += step) {
            if (p[0] != want[i]) {
                return 0;
            }
            vals[at[i]] = p[1];
        }
        return 1;
    }
#endif
    while (PyDict_Next(obj, &pos, &k, &v)) {
        if (i >= n || k != want[i]) {
            return 0;
        }
        vals[at[i++]] = v;
    }
    return i == n;
}

/* The values of the exact dict obj in the order of keys (a tuple of its keys,
 * sorted), read in one pass when big_orders has obj's insertion order of these
 * same keys: borrowed into vals, and 1; else 0 (vals partly written). Makes
 * nothing and runs no code, so the entry cannot change while it is read. */
PK_SHARED int
big_dict_values(PkState *st, PyObject *obj, PyObject *keys, PyObject **vals)
{
    BigOrder *e = big_order_for(st, obj, keys);
    return e != NULL && big_order_read(obj, e->order, e->at, vals);
}

/* A dict of more than BIG_DICT keys whose insertion order big_orders has (the
 * same key objects): its sorted keys, values and order from there, with no
 * sort and no lookup. 1 done (f filled), 0 not such a dict, -1 error. Runs no
 * user code. */
static int
classify_big_dict(Ctx *c, PyObject *obj, Found *f)
{
    BigOrder *e = big_order_for(c->st, obj, NULL);
    if (e == NULL) {
        return 0;
    }
    /* the entry's parts held, and everything allocated, before the dict is
     * read: an allocation may collect garbage, whose finalizers could change
     * the dict or the entry */
    Py_ssize_t n = PyTuple_GET_SIZE(e->order);
    PyObject *order = Py_NewRef(e->order), *keys = Py_NewRef(e->keys);
    PyObject *at_obj = Py_NewRef(e->at), *node = NULL, *values = NULL;
    int r = -1;
    /* the list last, filled at once: its items are not set (list_to_fill),
     * so no allocation, which may run the collector, comes between */
    if ((c->mode != WALK_LEAVES && (node = make_node(K_DICT, Py_None, n, keys)) == NULL) ||
        (values = list_to_fill(n)) == NULL) {
        goto done;
    }
    r = big_order_read(obj, order, at_obj, ((PyListObject *)values)->ob_item);
    if (r == 1) {
        /* the borrowed values made the list's own, with nothing run between */
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(PyList_GET_ITEM(values, i));
        }
        f->node = node;
        f->order = same_items(order, keys) ? (Py_DECREF(order), NULL) : order;
        f->order_known = 1;
        f->children = values;
        f->names = keys;
        f->keymode = KM_MAP;
        f->live = 0;
        f->dict_kind = 1;
        Py_DECREF(at_obj);
        return 1;
    }
done:
    /* another order after all (0), or an error (-1): the list holds no
     * references of its own */
    if (values != NULL) {
        Py_SET_SIZE(values, 0);
        Py_DECREF(values);
    }
    Py_XDECREF(node);
    Py_DECREF(order);
    Py_DECREF(keys);
    Py_DECREF(at_obj);
    return r;
}

/* f as a mapping's children: its node of kind (when want_node; aux: keys)
 * and its values, keyed by keys, in leaf order. Takes keys and values
 * (released on error). Returns 1, or -1 on error. Shared by the dict and
 * OrderedDict readings below. */
static int
found_mapping(Found *f, int kind, PyObject *keys, PyObject *values, int want_node, int dict_kind)
{
    f->node = NULL;
    if (want_node && (f->node = make_node(kind, Py_None, PyTuple_GET_SIZE(keys), keys)) == NULL) {
        Py_DECREF(keys);
        Py_DECREF(values);
        return -1;
    }
    f->children = values;
    f->names = keys;
    f->keymode = KM_MAP;
    f->live = 0;
    f->dict_kind = dict_kind;
    return 1;
}

/* A dict whose keys are all exact str or all exact int, with at most
 * SMALL_DICT entries: one pass over it and an insertion sort (or, for keys
 * that the dict_orders table has, its order). The result is what the general path gives,
 * since nothing here can run user code.
 * Returns 1 done, 0 not such a dict, -1 error. */
static int
classify_small_dict(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    /* keys and values in insertion order (ins, vi), then in key order (ks, vs) */
    PyObject *ks[SMALL_DICT], *vs[SMALL_DICT], *ins[SMALL_DICT], *vi[SMALL_DICT];
    Py_ssize_t n = PyDict_GET_SIZE(obj), pos = 0, i = 0;
    PyObject *k, *v;
    if (n > SMALL_DICT) {
        return 0;
    }
    int str = 1, num = 1;
#if DICT_READS
    PyObject **p;
    Py_ssize_t step;
    if (dict_table(obj, &p, &step)) {
        for (; i < n; i++, p += step) {
            k = p[0];
            str &= PyUnicode_CheckExact(k);
            num &= PyLong_CheckExact(k);
            ks[i] = ins[i] = k;
            vs[i] = vi[i] = p[1];
        }
    }
    else
#endif
        while (PyDict_Next(obj, &pos, &k, &v)) {
            str &= PyUnicode_CheckExact(k);
            num &= PyLong_CheckExact(k);
            ks[i] = ins[i] = k;
            vs[i] = vi[i] = v;
            i++;
        }
    if (!(str || num) || i != n) {
        return 0;
    }
    PyObject *tkeys = NULL, *values = NULL, *order = NULL;
    int permuted = 0, remember = 0;
    uint8_t perm[SMALL_DICT];
    MemoTable *table = &c->st->memo.dict_orders;
    uintptr_t key = dict_order_key(ins, n);
    DictOrder *m = KEEP_ACROSS_CALLS ? dict_order_find(table, key, ins, n) : NULL;
    f->node = NULL;
    if (m != NULL) {
        /* the memo's keys, in the memo's insertion order: its order serves
         * (ks and vs are in key order already when the keys were inserted so) */
        permuted = m->permuted;
        if (permuted) {
            for (i = 0; i < n; i++) {
                ks[m->perm[i]] = ins[i];
                vs[m->perm[i]] = vi[i];
            }
        }
        memo_touch(table, &m->head);
        tkeys = Py_NewRef(m->keys);
        if (c->mode != WALK_LEAVES) {
            f->node = Py_XNewRef(m->node);
            order = Py_XNewRef(m->order);
        }
        c->dict_misses = 0;
    }
    else {
        /* insertion sort; at[j] is where the j-th key in key order was
         * inserted, kept while this call may still write the memo */
        uint8_t at[SMALL_DICT];
        remember = KEEP_ACROSS_CALLS && c->dict_misses < DICT_ORDER_MISSES;
        c->dict_misses += remember; /* stops at DICT_ORDER_MISSES */
        for (i = 0; i < n; i++) {
            at[i] = (uint8_t)i;
        }
        for (Py_ssize_t a = 1; a < n; a++) {
            PyObject *kk = ks[a], *vv = vs[a];
            Py_ssize_t b = a;
            while (b > 0 && key_lt(kk, ks[b - 1], str)) {
                ks[b] = ks[b - 1];
                vs[b] = vs[b - 1];
                at[b] = at[b - 1];
                b--;
            }
            if (b != a) {
                permuted = 1;
                ks[b] = kk;
                vs[b] = vv;
                at[b] = (uint8_t)a;
            }
        }
        if (remember) {
            for (i = 0; i < n; i++) {
                perm[at[i]] = (uint8_t)i;
            }
        }
    }
    f->direct_n = 0;
    if (c->is_leaf == NULL && c->mode != WALK_PATHS && n > 0) {
        for (i = 0; i < n && known_leaf(c, Py_TYPE(vs[i])); i++) {
        }
        int held = i == n ? stack_holds(s, obj) : 1;
        if (held < 0) {
            goto fail;
        }
        if (!held) {
            memcpy(f->direct, vs, n * sizeof(PyObject *));
            f->direct_n = n;
        }
    }
    if (tkeys == NULL) {
        /* leaves only, no child to visit and nothing to remember: no names
         * are needed */
        if (!remember && f->direct_n && c->mode == WALK_LEAVES) {
            tkeys = Py_NewRef(empty_tuple);
        }
        else if ((tkeys = seq_of(0, ks, n)) == NULL) {
            goto fail;
        }
    }
    if (f->direct_n) {
        Py_INCREF(empty_tuple);
        values = empty_tuple;
    }
    else if ((values = children_tuple(c->st, vs, n)) == NULL) {
        goto fail;
    }
    int made_order = 0, made_node = 0;
    if (c->mode != WALK_LEAVES && permuted && order == NULL) {
        if ((order = seq_of(0, ins, n)) == NULL) {
            goto fail;
        }
        made_order = 1;
    }
    if (f->node == NULL && c->mode != WALK_LEAVES) {
        /* made in every mode that names the keys: the memo keeps it */
        f->node = make_node(K_DICT, Py_None, n, tkeys);
        if (f->node == NULL) {
            goto fail;
        }
        made_node = 1;
    }
    /* after the last allocation: the set as it is now (see above) */
    if (remember) {
        m = dict_order_write(table, key, ins, tkeys, perm, permuted, f->node, order);
    }
    else if (KEEP_ACROSS_CALLS && (made_order || made_node) &&
             (m = dict_order_find(table, key, ins, n)) != NULL) {
        if (made_node && m->node == NULL) {
            m->node = Py_NewRef(f->node);
        }
        if (made_order && m->order == NULL) {
            m->order = Py_NewRef(order);
        }
    }
    /* the memo holds this order: the spec's pair of it may be kept
     * (_flatten.c's kept_pair) */
    f->order_kept = order != NULL && m != NULL && m->order == order;
    f->order = order;
    f->order_known = 1;
    f->children = values;
    f->names = tkeys;
    f->keymode = KM_MAP;
    f->live = 0;
    f->dict_kind = 1;
    return 1;
fail:
    Py_XDECREF(f->node);
    f->node = NULL;
    Py_XDECREF(tkeys);
    Py_XDECREF(values);
    Py_XDECREF(order);
    return -1;
}

static int
classify_dict(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    int r = classify_small_dict(c, s, obj, f);
    if (r == 0) {
        r = classify_big_dict(c, obj, f);
    }
    if (r != 0) {
        return r;
    }
    if (stack_freeze(s) < 0) {
        return -1;
    }
    PyObject *keys = PyDict_Keys(obj), *ins = NULL;
    if (keys == NULL) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n > 1) {
        /* sorted(keys); keys that are not mutually orderable keep insertion order */
        PyObject *sorted = PyList_GetSlice(keys, 0, n);
        if (sorted == NULL) {
            Py_DECREF(keys);
            return -1;
        }
        if (PyList_Sort(sorted) < 0) {
            Py_DECREF(sorted);
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(keys);
                return -1;
            }
            PyErr_Clear();
        }
        else {
            /* a large dict's insertion order is kept, for big_orders */
            ins = n > BIG_DICT && PyList_GET_SIZE(sorted) == n ? keys : (Py_DECREF(keys), NULL);
            keys = sorted;
        }
    }
    n = PyList_GET_SIZE(keys);
    PyObject *values = dict_values(obj, ((PyListObject *)keys)->ob_item, n);
    if (values == NULL) {
        Py_DECREF(keys);
        Py_XDECREF(ins);
        return -1;
    }
    PyObject *tkeys = PyList_AsTuple(keys);
    Py_DECREF(keys);
    if (tkeys == NULL) {
        Py_DECREF(values);
        Py_XDECREF(ins);
        return -1;
    }
    f->node = NULL;
    if (ins != NULL) {
        /* keys all exact str or all exact int (so nothing above ran user
         * code), just sorted: the order noted in big_orders (as keys_sorted
         * would have it), and found here, not asked of the pure engine again */
        int str = 1, num = 1;
        for (Py_ssize_t i = 0; i < n && (str || num); i++) {
            str &= PyUnicode_CheckExact(PyList_GET_ITEM(ins, i));
            num &= PyLong_CheckExact(PyList_GET_ITEM(ins, i));
        }
        PyObject *order = str || num ? PyList_AsTuple(ins) : NULL;
        Py_DECREF(ins);
        if (str || num) {
            Py_ssize_t *at = order ? PyMem_Malloc(n * sizeof(Py_ssize_t)) : NULL;
            if (order != NULL && at == NULL) {
                PyErr_NoMemory();
            }
            if (order != NULL && same_items(order, tkeys)) {
                /* in sorted order: one tuple for both */
                Py_SETREF(order, Py_NewRef(tkeys));
            }
            if (at == NULL ||
                key_places(((PyTupleObject *)tkeys)->ob_item, ((PyTupleObject *)order)->ob_item,
                           n, at) < 0 ||
                big_order_note(c->st, tkeys, order, at, n) < 0) {
                PyMem_Free(at);
                Py_XDECREF(order);
                Py_DECREF(tkeys);
                Py_DECREF(values);
                return -1;
            }
            PyMem_Free(at);
            if (order == tkeys) {
                Py_DECREF(order);
            }
            else {
                f->order = order;
            }
            f->order_known = 1;
        }
    }
    if (found_mapping(f, K_DICT, tkeys, values, c->mode != WALK_LEAVES, 1) < 0) {
        Py_CLEAR(f->order);
        return -1;
    }
    return 1;
}

#if READ_SNAPSHOTS
/* classify_dict of a snapshot of obj (dict_snapshot), every part of f that
 * its read gives found from the snapshot: its order too (found_order would
 * read obj again), and its direct leaves held (they are the snapshot's). */
static int
classify_dict_snapshot(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    PyObject *copy = dict_snapshot(obj);
    if (copy == NULL) {
        return -1;
    }
    int r = classify_dict(c, s, copy, f);
    if (r == 1 && f->direct_n && !f->direct_owned) {
        for (Py_ssize_t i = 0; i < f->direct_n; i++) {
            Py_INCREF(f->direct[i]);
        }
        f->direct_owned = 1;
    }
    if (r == 1 && f->dict_kind && !f->order_known && f->node != NULL) {
        PyObject *order = stack_freeze(s) < 0 ? NULL : dict_order(f->node, copy, f->names);
        if (order == NULL) {
            release_direct(f);
            Py_CLEAR(f->node);
            Py_CLEAR(f->children);
            Py_CLEAR(f->names);
            Py_DECREF(copy);
            return -1;
        }
        if (order == Py_None) {
            Py_DECREF(order);
        }
        else {
            f->order = order;
        }
        f->order_known = 1;
    }
    Py_DECREF(copy);
    return r;
}
#endif

/* An exact OrderedDict's keys and values in its own order, in one pass over
 * its dict, when every key is an exact str or every key an exact int (their
 * hash and == run no Python code) and its own order is its dict's insertion
 * order (as it is unless move_to_end reordered it): checked by iterating it,
 * which finds each key by its hash. Returns 1 with *keys and *values new
 * tuples, 0 when it is not such a dict (the pure engine reads it), -1 on
 * error. Shared by classify and flatten_up_to (_up_to.c). */
static int
odict_items_held(PyObject *obj, PyObject **keys_out, PyObject **values_out)
{
    Py_ssize_t n = PyDict_GET_SIZE(obj), pos = 0, i = 0;
    PyObject *keys = PyTuple_New(n), *values = keys ? PyTuple_New(n) : NULL, *k, *v;
    if (values == NULL) {
        Py_XDECREF(keys);
        return -1;
    }
    int str = 1, num = 1;
    while (i < n && PyDict_Next(obj, &pos, &k, &v)) {
        str &= PyUnicode_CheckExact(k);
        num &= PyLong_CheckExact(k);
        PyTuple_SET_ITEM(keys, i, Py_NewRef(k));
        PyTuple_SET_ITEM(values, i, Py_NewRef(v));
        i++;
    }
    int same = i == n && (str || num) ? odict_same_order(obj) : 0;
    if (same < 0) {
        Py_DECREF(keys);
        Py_DECREF(values);
        return -1;
    }
    if (!same) {
        Py_DECREF(keys);
        Py_DECREF(values);
        return 0;
    }
    *keys_out = keys;
    *values_out = values;
    return 1;
}

/* odict_items_held, under the OrderedDict's own lock where the GIL can be off
 * (READ_SNAPSHOTS: its dict and its links read as one state) */
PK_SHARED int
odict_items(PyObject *obj, PyObject **keys_out, PyObject **values_out)
{
    int r;
#if READ_SNAPSHOTS
    Py_BEGIN_CRITICAL_SECTION(obj);
    r = odict_items_held(obj, keys_out, values_out);
    Py_END_CRITICAL_SECTION();
#else
    r = odict_items_held(obj, keys_out, values_out);
#endif
    return r;
}

/* An exact OrderedDict, as _pure.classify reads it, where odict_items can:
 * 1 with f set, 2 for the pure engine, -1 on error. */
static int
classify_odict(PyObject *obj, Found *f, int want_node)
{
    PyObject *keys, *values;
    int r = odict_items(obj, &keys, &values);
    if (r <= 0) {
        return r < 0 ? -1 : 2;
    }
    return found_mapping(f, K_ORDEREDDICT, keys, values, want_node, 0);
}

/* Returns 0 for a leaf, 1 for a container (f filled), -1 on error. */
PK_SHARED int
classify(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    PyTypeObject *t = Py_TYPE(obj);
    int want_node = c->mode != WALK_LEAVES;
    if (c->rules != NULL) {
        if (stack_freeze(s) < 0) {
            return -1;
        }
        PyObject *rule = PyDict_GetItemWithError(c->rules, (PyObject *)t);
        if (rule == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (rule == as_leaf_rule) {
            return 0; /* Rule.LEAF: a leaf, whatever it is */
        }
        if (rule != NULL) {
            Py_INCREF(rule);
            PyObject *fn = PyObject_GetAttr(rule, s_flatten);
            PyObject *res = fn ? PyObject_CallOneArg(fn, obj) : NULL;
            Py_XDECREF(fn);
            int r = res ? user_node(c, s, res, t, rule, f) : -1;
            Py_XDECREF(res);
            Py_DECREF(rule);
            return r;
        }
    }
    if (t == &PyTuple_Type) {
        f->node = want_node ? seq_node(c->st, K_TUPLE, PyTuple_GET_SIZE(obj)) : NULL;
        if (want_node && f->node == NULL) {
            return -1;
        }
        Py_INCREF(obj);
        f->children = obj;
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    if (t == &PyList_Type) {
        if (c->is_leaf != NULL || READ_SNAPSHOTS) {
            /* a snapshot (READ_SNAPSHOTS: taken under the list's lock) */
            if ((f->children = PyList_AsTuple(obj)) == NULL) {
                return -1;
            }
            f->node = want_node ? seq_node(c->st, K_LIST, PyTuple_GET_SIZE(f->children)) : NULL;
            if (want_node && f->node == NULL) {
                Py_CLEAR(f->children);
                return -1;
            }
            f->live = 0;
        }
        else {
            f->node = want_node ? seq_node(c->st, K_LIST, PyList_GET_SIZE(obj)) : NULL;
            if (want_node && f->node == NULL) {
                return -1;
            }
            Py_INCREF(obj);
            f->children = obj;
            f->live = 1;
        }
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->dict_kind = 0;
        return 1;
    }
    if (t == &PyDict_Type) {
#if READ_SNAPSHOTS
        return classify_dict_snapshot(c, s, obj, f);
#else
        return classify_dict(c, s, obj, f);
#endif
    }
    if (obj == Py_None) {
        f->node = want_node ? (Py_INCREF(NONE_NODE), NONE_NODE) : NULL;
        Py_INCREF(empty_tuple);
        f->children = empty_tuple;
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    if ((PyObject *)t == OrderedDict_t) {
        int r = classify_odict(obj, f, want_node);
        if (r != 2) {
            return r;
        }
    }
    /* Lists being read are copied (stack_freeze) before anything that could
     * run user code: making a class's plan could, a kept plan cannot; a leaf
     * runs none, nor does a record whose fields have fast reads
     * (record_fields copies them before any getattr). A plan holds for the
     * whole call. */
    TypeEntry *e = tc_find(&c->types, t);
    if (e == NULL) {
        for (int i = 0; i < 6; i++) {
            if (t == atom_types[i] && c->atom_leaf[i]) {
                return 0;
            }
        }
        if ((e = class_entry(c, s, t)) == NULL) {
            return -1;
        }
    }
    if (e->plan != PLAN_LEAF &&
        !(e->reads != NULL && (e->plan == PLAN_DATACLASS || e->plan == PLAN_ATTRS)) &&
        stack_freeze(s) < 0) {
        return -1;
    }
    switch (e->plan) {
    case PLAN_LEAF:
        c->last_leaf = t;
        return 0;
    case PLAN_TUPLE_LEAF:
        return 0;
    case PLAN_NAMEDTUPLE: {
        PyObject *fields = e->info;
        if (PyTuple_GET_SIZE(fields) != PyTuple_GET_SIZE(obj)) {
            return 0;
        }
        f->node = want_node ? make_node(K_NAMEDTUPLE, (PyObject *)t, PyTuple_GET_SIZE(obj), fields)
                            : NULL;
        if (want_node && f->node == NULL) {
            return -1;
        }
        Py_INCREF(obj);
        f->children = obj;
        Py_INCREF(fields);
        f->names = fields;
        f->keymode = KM_ATTR;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    case PLAN_DATACLASS:
    case PLAN_ATTRS: {
        int r = record_fields(c, s, obj, e, e->plan == PLAN_DATACLASS ? K_DATACLASS : K_ATTRS, f,
                              want_node);
        if (r != 2) {
            return r;
        }
        break;
    }
    case PLAN_CUSTOM: {
        PyObject *fn = PyObject_GetAttr(obj, s_tree_flatten);
        if (fn == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                return -1;
            }
            /* the class lost it while this call ran (another thread, or an
             * instance's own __tree_flatten__): read afresh, as _pure.classify
             * reads it, for the rest of the call */
            PyErr_Clear();
            e->plan = PLAN_PYTHON;
            break;
        }
        PyObject *res = PyObject_CallNoArgs(fn);
        Py_DECREF(fn);
        int r = res ? user_node(c, s, res, t, NULL, f) : -1;
        Py_XDECREF(res);
        return r;
    }
    case PLAN_MAPPING: {
        int r = mapping_classify(c, obj, e, f);
        if (r != 2) {
            return r;
        }
        break;
    }
    default:
        break;
    }
    if (stack_freeze(s) < 0) { /* not done above for a record */
        return -1;
    }
    int r = classify_python(c, s, obj, f);
    if (r == 0 && e->plan == PLAN_PYTHON && !PyTuple_Check(obj)) {
        /* the pure engine remembers leaf types for the rest of the call */
        e->plan = PLAN_LEAF;
        Py_CLEAR(e->info);
        Py_CLEAR(e->reads_obj);
        e->reads = NULL;
    }
    return r;
}

/* The insertion order of a dict node, when it differs from its leaf order;
 * new reference to it, or to None. */
PK_SHARED PyObject *
dict_order(PyObject *node, PyObject *obj, PyObject *names)
{
    if (PyDict_CheckExact(obj) && PyTuple_CheckExact(names) &&
        PyDict_GET_SIZE(obj) == PyTuple_GET_SIZE(names)) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        int same = 1;
#if DICT_READS
        PyObject **p;
        Py_ssize_t step;
        if (dict_table(obj, &p, &step)) {
            for (Py_ssize_t n = PyDict_GET_SIZE(obj); same && i < n; i++, p += step) {
                same = p[0] == PyTuple_GET_ITEM(names, i);
            }
        }
        else
#endif
            while (PyDict_Next(obj, &pos, &k, &v)) {
                if (k != PyTuple_GET_ITEM(names, i++)) {
                    same = 0;
                    break;
                }
            }
        if (same) {
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallFunctionObjArgs(py_dict_order_differs, node, obj, NULL);
}
