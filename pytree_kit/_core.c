/* _core.c: what the engine's parts share, defined once: the module's
 * constants (set by _speedups.c's init) and the helpers _core.h declares.
 * Calls: only the C API.
 */

#include "_core.h"

/* ------------------------------------------------------------------------ */
/* Module constants, set once by the module's init. */

PK_DATA PyObject *kind_obj[K_COUNT];
PK_DATA PyObject *LEAF_NODE, *NONE_NODE;
PK_DATA PyObject *s_thread_leaf;
PK_DATA PyTypeObject *TreeSpec_type;
PK_DATA Py_ssize_t off_nodes, off_orders, off_num_leaves, off_hash, off_paths, off_recipe;
PK_DATA PyObject *as_leaf_rule;  /* _kinds.AS_LEAF: Rule.LEAF */
PK_DATA PyObject *py_class_plan; /* _pure.class_plan: how a class's instances are read */
PK_DATA PyObject *py_refuse_leaves, *py_refuse_trees; /* _messages': a str, bytes or mapping given */
PK_DATA PyObject *py_classify, *py_dict_order_differs, *py_dict_order, *py_custom_result,
    *py_rule_result, *py_cycle_error, *py_match, *py_mismatch, *py_build;
PK_DATA PyObject *SequenceKey_t, *DictKey_t, *GetAttrKey_t;
PK_DATA PyObject *OrderedDict_t, *defaultdict_t, *deque_t;
PK_DATA PyObject *s_tree_flatten, *s_tree_unflatten, *s_new, *s_flatten, *s_len, *s_the_spec,
    *s_the_tree;
PK_DATA PyObject *Carried_t, *nothing_carried;
PK_DATA Py_ssize_t off_carried_order, off_carried_state; /* its slots' offsets */
PK_DATA PyObject *s_dunder_dict, *s_data, *s_dict, *s_userdict;
PK_DATA PyObject *empty_tuple;

/* ------------------------------------------------------------------------ */
/* Helpers */

PK_SHARED PyObject *
thread_leaf_node(void)
{
#ifdef Py_GIL_DISABLED
    /* kept in the thread state's dict, which only this thread reads and
     * which lives as long as the thread: the borrowed reference holds for
     * the call; any failure gives LEAF_NODE (equal, and shared) */
    PyObject *d = PyThreadState_GetDict();
    if (d == NULL) {
        return LEAF_NODE;
    }
    PyObject *node = PyDict_GetItemWithError(d, s_thread_leaf);
    if (node != NULL) {
        return node;
    }
    if (PyErr_Occurred() ||
        (node = PyTuple_Pack(4, PyTuple_GET_ITEM(LEAF_NODE, 0), PyTuple_GET_ITEM(LEAF_NODE, 1),
                             PyTuple_GET_ITEM(LEAF_NODE, 2), PyTuple_GET_ITEM(LEAF_NODE, 3))) ==
            NULL) {
        PyErr_Clear();
        return LEAF_NODE;
    }
    int r = PyDict_SetItem(d, s_thread_leaf, node);
    Py_DECREF(node);
    if (r < 0) {
        PyErr_Clear();
        return LEAF_NODE;
    }
    return node;
#else
    return LEAF_NODE;
#endif
}

#ifdef Py_GIL_DISABLED
PK_SHARED int
is_thread_leaf_node(PyObject *node)
{
    /* (LEAF, None, 0, None), its items the same objects as LEAF_NODE's */
    return PyTuple_CheckExact(node) && PyTuple_GET_SIZE(node) == 4 &&
           PyTuple_GET_ITEM(node, 0) == PyTuple_GET_ITEM(LEAF_NODE, 0) &&
           PyTuple_GET_ITEM(node, 1) == PyTuple_GET_ITEM(LEAF_NODE, 1) &&
           PyTuple_GET_ITEM(node, 2) == PyTuple_GET_ITEM(LEAF_NODE, 2) &&
           PyTuple_GET_ITEM(node, 3) == PyTuple_GET_ITEM(LEAF_NODE, 3);
}
#endif

PK_SHARED int
raise_returned(PyObject *exc)
{
    /* Raise an exception instance that a pure-engine helper returned. */
    if (exc == NULL) {
        return -1;
    }
    if (PyExceptionInstance_Check(exc)) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    }
    else {
        PyErr_SetString(PyExc_SystemError, "pytree_kit: an error helper returned a non-exception");
    }
    Py_DECREF(exc);
    return -1;
}

PK_SHARED PyObject *
make_node(int kind, PyObject *type, Py_ssize_t arity, PyObject *aux)
{
    /* (kind, type, arity, aux); steals nothing. */
    PyObject *n = PyLong_FromSsize_t(arity);
    if (n == NULL) {
        return NULL;
    }
    PyObject *node = PyTuple_New(4);
    if (node == NULL) {
        Py_DECREF(n);
        return NULL;
    }
    Py_INCREF(kind_obj[kind]);
    PyTuple_SET_ITEM(node, 0, kind_obj[kind]);
    Py_INCREF(type);
    PyTuple_SET_ITEM(node, 1, type);
    PyTuple_SET_ITEM(node, 2, n);
    Py_INCREF(aux);
    PyTuple_SET_ITEM(node, 3, aux);
    return node;
}

PK_SHARED PyObject *
make_spec(PyObject *nodes, PyObject *orders, Py_ssize_t num_leaves)
{
    /* TreeSpec._make(nodes, orders, num_leaves); steals nodes and orders. */
    PyObject *spec = TreeSpec_type->tp_alloc(TreeSpec_type, 0);
    PyObject *n = PyLong_FromSsize_t(num_leaves);
    if (spec == NULL || n == NULL) {
        Py_XDECREF(spec);
        Py_XDECREF(n);
        Py_DECREF(nodes);
        Py_DECREF(orders);
        return NULL;
    }
    SLOT(spec, off_nodes) = nodes;
    SLOT(spec, off_orders) = orders;
    SLOT(spec, off_num_leaves) = n;
    SLOT(spec, off_hash) = Py_NewRef(Py_None);
    SLOT(spec, off_paths) = Py_NewRef(Py_None);
    SLOT(spec, off_recipe) = Py_NewRef(Py_None);
    return spec;
}

PK_SHARED int
grow_array(void **v, void *inline_v, Py_ssize_t n, Py_ssize_t *cap, size_t item, Py_ssize_t need)
{
    Py_ssize_t new_cap = *cap * 2 > need ? *cap * 2 : need;
    if ((size_t)new_cap > PY_SSIZE_T_MAX / item) {
        PyErr_NoMemory();
        return -1;
    }
    void *p;
    if (*v == inline_v) {
        p = PyMem_Malloc(new_cap * item);
        if (p != NULL) {
            memcpy(p, inline_v, n * item);
        }
    }
    else {
        p = PyMem_Realloc(*v, new_cap * item);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *v = p;
    *cap = new_cap;
    return 0;
}

PK_SHARED int
vec_grow(Vec *a, Py_ssize_t need)
{
    void *v = a->v;
    if (grow_array(&v, a->inline_v, a->n, &a->cap, sizeof(PyObject *), need) < 0) {
        return -1;
    }
    a->v = v;
    return 0;
}

PK_SHARED void
vec_clear(Vec *a)
{
    for (Py_ssize_t i = 0; i < a->n; i++) {
        Py_DECREF(a->v[i]);
    }
    if (a->v != a->inline_v) {
        PyMem_Free(a->v);
    }
    vec_init(a);
}

PK_SHARED PyObject *
vec_to_tuple(Vec *a)
{
    /* moves the references into a new tuple */
    PyObject *t = PyTuple_New(a->n);
    if (t == NULL) {
        return NULL;
    }
    memcpy(((PyTupleObject *)t)->ob_item, a->v, a->n * sizeof(PyObject *));
    if (a->v != a->inline_v) {
        PyMem_Free(a->v);
    }
    vec_init(a);
    return t;
}

PK_SHARED PyObject *
seq_of(int list, PyObject **ch, Py_ssize_t n)
{
    PyObject *r = list ? PyList_New(n) : PyTuple_New(n);
    if (r == NULL) {
        return NULL;
    }
    PyObject **items = list ? ((PyListObject *)r)->ob_item : ((PyTupleObject *)r)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(ch[i]);
        items[i] = ch[i];
    }
    return r;
}

/* Where the GIL can be off (Py_GIL_DISABLED), a list's item array is not a
 * plain PyMem block (its allocation carries a header of its own): vec_to_list
 * and list_to_fill make their lists by PyList_New there, and hand them no
 * array. */
PK_SHARED PyObject *
vec_to_list(Vec *a)
{
    PyObject *l;
#ifdef Py_GIL_DISABLED
    const int hand_over = 0;
#else
    const int hand_over = a->v != a->inline_v;
#endif
    if (!hand_over) {
        l = PyList_New(a->n);
        if (l == NULL) {
            return NULL;
        }
        if (a->n) {
            memcpy(((PyListObject *)l)->ob_item, a->v, a->n * sizeof(PyObject *));
        }
        if (a->v != a->inline_v) {
            PyMem_Free(a->v);
        }
    }
    else {
        l = PyList_New(0);
        if (l == NULL) {
            return NULL;
        }
        if (a->cap - a->n > a->n / 8) {
            void *v = PyMem_Realloc(a->v, (a->n ? a->n : 1) * sizeof(PyObject *));
            if (v != NULL) {
                a->v = v;
                a->cap = a->n ? a->n : 1;
            }
        }
        ((PyListObject *)l)->ob_item = a->v;
        ((PyListObject *)l)->allocated = a->cap;
        Py_SET_SIZE(l, a->n);
    }
    vec_init(a);
    return l;
}

PK_SHARED PyObject *
list_to_fill(Py_ssize_t n)
{
#ifdef Py_GIL_DISABLED
    const int plain = 1;
#else
    const int plain = 0;
#endif
    if (plain || n == 0 || (size_t)n > PY_SSIZE_T_MAX / sizeof(PyObject *)) {
        return PyList_New(n);
    }
    PyObject *items = PyMem_Malloc(n * sizeof(PyObject *));
    if (items == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *l = PyList_New(0);
    if (l == NULL) {
        PyMem_Free(items);
        return NULL;
    }
    ((PyListObject *)l)->ob_item = (PyObject **)items;
    ((PyListObject *)l)->allocated = n;
    Py_SET_SIZE(l, n);
    return l;
}

#if READ_SNAPSHOTS
PK_SHARED PyObject *
dict_snapshot(PyObject *d)
{
    if (PyDict_CheckExact(d)) {
        return PyDict_Copy(d); /* under d's lock */
    }
    /* a subclass: its storage's items (PyDict_Items reads the storage under
     * d's lock, whatever the class's methods say), then a dict of them, which
     * no other thread can see */
    PyObject *items = PyDict_Items(d), *m = items ? PyDict_New() : NULL;
    for (Py_ssize_t i = 0; m != NULL && i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        if (PyDict_SetItem(m, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1)) < 0) {
            Py_CLEAR(m);
        }
    }
    Py_XDECREF(items);
    return m;
}
#endif
