/* _flatten.c: flatten, leaves, flatten_with_path and iter_leaves.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   walk_classify  a value as the walk sees it (is_leaf, the leaf types,
 *                  classify), and found_order a dict node's order
 *   kept_pair      a dict order's (position, order) pair in the spec, kept
 *                  across calls for the orders dict_memo holds
 *   walk_run       the one pre-order walk, by mode (WALK_LEAVES,
 *                  WALK_SPEC, WALK_PATHS), eager or lazy
 *   walk           an eager call: the leaves, the spec, the paths
 *   LeafIter       iter_leaves's iterator: a walk kept between __next__ calls
 *   any_leaf       tree_any / tree_all: a lazy walk that tests each leaf's
 *                  truth as it is found and stops at the first that decides
 *   flatten_one_level  the root's children and its node over a leaf each
 *   pk_walk        the entry point FastCall calls (_speedups.h)
 * Calls: _classify.c (classify, dict_order), _stack.c, _core.h's Vec.
 */

#include "_core.h"

/* ------------------------------------------------------------------------ */
/* flatten, leaves, flatten_with_path */

/* The children of fr from fr->pos on that are leaves by their type (the first
 * one is), up to the first that is not: new references into leaves, and as
 * many leaf nodes into nodes unless it is NULL; fr->pos moves past them. Not
 * inlined: walk's loop is short of registers. */
PK_NO_INLINE static int
leaf_run_out(Ctx *c, Frame *fr, Vec *leaves, Vec *nodes)
{
    PyObject **items = seq_items(fr->children);
    Py_ssize_t pos = fr->pos, end = fr->n;
    if (vec_reserve(leaves, end - pos) < 0 || (nodes && vec_reserve(nodes, end - pos) < 0)) {
        return -1;
    }
    /* known_leaf(x's type) was true, so that type is c->last_leaf */
    PyTypeObject *last = c->last_leaf;
    PyObject **src = items + pos, **stop = items + end, **dst = leaves->v + leaves->n;
    /* four at a time while all four have the last leaf type: their types are
     * read together, so the reads of the objects overlap */
    while (stop - src >= 4 && ((Py_TYPE(src[0]) == last) & (Py_TYPE(src[1]) == last) &
                               (Py_TYPE(src[2]) == last) & (Py_TYPE(src[3]) == last))) {
        for (int j = 0; j < 4; j++) {
            Py_INCREF(src[j]);
            dst[j] = src[j];
        }
        src += 4;
        dst += 4;
    }
    if (src == stop) {
        goto done;
    }
    if (Py_TYPE(*src) != last && !known_leaf(c, Py_TYPE(*src))) {
        goto done; /* not reached with no leaf taken: the first child is a leaf */
    }
    last = c->last_leaf;
    for (;;) {
        PyObject *x = *src++;
        Py_INCREF(x);
        *dst++ = x;
        if (src == stop) {
            break;
        }
        if (Py_TYPE(*src) != last) {
            if (!known_leaf(c, Py_TYPE(*src))) {
                break;
            }
            last = c->last_leaf;
        }
    }
done:;
    Py_ssize_t k = src - (items + pos);
    leaves->n += k;
    fr->pos = pos + k;
    if (nodes) {
        PyObject **o = nodes->v + nodes->n;
        PyObject *leaf_node = c->leaf_node;
        for (Py_ssize_t j = 0; j < k; j++) {
            o[j] = leaf_node;
        }
        nodes->n += k;
#if defined(Py_REF_DEBUG) || defined(Py_GIL_DISABLED)
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_INCREF(leaf_node);
        }
#else
        /* one add, not a chain of k dependent ones on a single count */
        Py_SET_REFCNT(leaf_node, Py_REFCNT(leaf_node) + k);
#endif
    }
    return 0;
}

/* A traversal's whole state: walk() keeps one on the C stack for one call,
 * a LeafIter (below) one between its __next__ calls. */
typedef struct {
    Ctx c;
    Stack s;
    Vec nodes, keys, leaves;
    PyObject *orders; /* strong or NULL: (node index, insertion order) pairs */
    PyObject *paths;  /* strong or NULL: WALK_PATHS's paths */
    PyObject *obj;    /* strong or NULL: the next value to classify */
    WalkMode mode;
} Walk;

static int
walk_init(Walk *w, PkState *st, PyObject *tree, PyObject *is_leaf, PyObject *rules,
          WalkMode mode)
{
    stack_init(&w->s, st);
    vec_init(&w->nodes);
    vec_init(&w->keys);
    vec_init(&w->leaves);
    w->orders = w->paths = w->obj = NULL;
    w->mode = mode;
    if (ctx_init(&w->c, st, is_leaf, rules, mode) < 0) {
        return -1;
    }
    if (mode == WALK_PATHS && (w->paths = PyList_New(0)) == NULL) {
        return -1;
    }
    Py_INCREF(tree);
    w->obj = tree;
    return 0;
}

/* Drop what w holds; w may be cleared again. */
static void
walk_clear(Walk *w)
{
    Py_CLEAR(w->obj);
    vec_clear(&w->leaves);
    Py_CLEAR(w->orders);
    Py_CLEAR(w->paths);
    vec_clear(&w->nodes);
    vec_clear(&w->keys);
    stack_clear(&w->s);
    ctx_clear(&w->c);
}

/* Order pairs kept across calls
 *
 * A dict whose insertion order is not its key order puts a (position,
 * order) pair in the spec: the same pair, call after call, for the same tree,
 * since flatten gives the same order tuple to dicts of the same keys
 * (_classify.c's dict_orders table). The pairs of the orders that table
 * holds are kept in the memo's pairs table (_memo.c), PAIR_WAYS ways a set, a
 * set chosen by order and position, and given again: a spec's orders share them.
 * That table holds only orders of exact str or int keys, so no user object
 * is kept alive here, and nothing dropped from an entry runs user code; an
 * entry holds its pair, and so its order, alive. Only pairs of the first
 * PAIR_POSITIONS nodes are kept: the dicts of a list of 10,000 records, each
 * at its own position, would take the entries from one another on every
 * dict, for nothing. */
#define PAIR_POSITIONS 1024

/* The (position, order) pair; steals order, even on error. keep: order is
 * the table's (Found's order_kept). */
static PyObject *
kept_pair(PkState *st, Py_ssize_t position, PyObject *order, int keep)
{
    if (!keep || !KEEP_ACROSS_CALLS || position >= PAIR_POSITIONS) {
        return order_pair(position, order);
    }
    MemoTable *t = &st->memo.pairs;
    uintptr_t key = (ptr_hash(order) ^ ((size_t)position * 0x9E3779B97F4A7C15ULL)) | 1;
    MemoHead *set = memo_set(t, key);
    for (unsigned int w = 0; w < t->ways; w++) {
        KeptPair *e = (KeptPair *)memo_way(t, set, w);
        PyObject *p = e->pair;
        if (p != NULL && e->head.key == key && PyTuple_GET_ITEM(p, 1) == order &&
            small_long(PyTuple_GET_ITEM(p, 0)) == position) {
            memo_touch(t, &e->head);
            Py_DECREF(order);
            return Py_NewRef(p);
        }
    }
    PyObject *pair = order_pair(position, order);
    if (pair != NULL) {
        /* the set as it is now: order_pair's allocations may have run code */
        KeptPair *e = (KeptPair *)memo_slot(t, key, 0);
        PyObject *old = e->pair;
        e->pair = Py_NewRef(pair);
        Py_XDECREF(old);
    }
    return pair;
}

/* How the walk starts a Found for each value: nothing held yet. */
static inline void
found_init(Found *f)
{
    f->order = NULL;
    f->order_known = 0;
    f->order_kept = 0;
    f->direct_n = 0;
    f->direct_owned = 0;
}

/* is_leaf(path, obj), path the tuple of the keys that lead to obj (the
 * walk's keys: WALK_PATHS keeps them for each value before classifying it) */
PK_NO_INLINE static PyObject *
is_leaf_at_path(Ctx *c, PyObject *obj)
{
    PyObject *path = seq_of(0, c->path_keys->v, c->path_keys->n);
    if (path == NULL) {
        return NULL;
    }
    PyObject *args[2] = {path, obj};
    PyObject *v = PyObject_Vectorcall(c->is_leaf, args, 2, NULL);
    Py_DECREF(path);
    return v;
}

/* What the walk makes of a value: is_leaf's answer first when it is given,
 * then the leaf types, then classify. 0 for a leaf, 1 for a node (f
 * filled), -1 on error. */
static PK_ALWAYS_INLINE int
walk_classify(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    if (c->is_leaf != NULL) {
        PyObject *v = c->path_keys == NULL ? PyObject_CallOneArg(c->is_leaf, obj)
                                           : is_leaf_at_path(c, obj);
        if (v == NULL) {
            return -1;
        }
        int r = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
        return classify(c, s, obj, f);
    }
    return known_leaf(c, Py_TYPE(obj)) ? 0 : classify(c, s, obj, f);
}

/* A dict node's insertion order where it differs from its leaf order (a new
 * reference), or None; f's order is taken. classify found it, or it is read
 * now, after the lists being read are copied (dict_order can run code). */
static inline PyObject *
found_order(Stack *s, Found *f, PyObject *obj)
{
    PyObject *order = f->order;
    f->order = NULL;
    if (order != NULL) {
        return order;
    }
    if (f->order_known) {
        return Py_NewRef(Py_None);
    }
    return stack_freeze(s) < 0 ? NULL : dict_order(f->node, obj, f->names);
}

/* How walk_run returns: EAGER, once the tree is done; LAZY_YIELD, as soon
 * as a leaf is ready, with the lists still being read copied for the
 * caller's code (iter_leaves); LAZY_TEST, as soon as one leaf is ready, with
 * nothing copied and no run of leaves read ahead (any_leaf). */
enum { EAGER, LAZY_YIELD, LAZY_TEST };

/* Walk from w->obj on in pre-order, appending to w's leaves (and nodes,
 * orders and paths by its mode). Returns 0 once the tree is done, -1 on
 * error, and, when lazy, 1 as soon as a leaf is ready, with w->obj the next
 * value to classify. Inlined into each caller, so walk()'s copy has lazy
 * constant EAGER and its loop is as it was before there was a lazy one. */
static PK_ALWAYS_INLINE int
walk_run(Walk *w, const int lazy)
{
    Ctx *const c = &w->c;
    Stack *const s = &w->s;
    Vec *const nodes = &w->nodes, *const keys = &w->keys, *const leaves = &w->leaves;
    const WalkMode mode = w->mode;
    PyObject *obj = w->obj;
    w->obj = NULL;
    for (;;) {
        if (lazy && leaves->n) {
            /* a leaf is ready: return it before anything that can run user
             * code. LAZY_YIELD: the caller's code runs next, so the lists
             * still being read are copied now, as they are (stack_freeze);
             * LAZY_TEST: the caller copies them itself if it runs code. */
            w->obj = obj;
            return lazy == LAZY_YIELD && stack_freeze(s) < 0 ? -1 : 1;
        }
        Found f;
        found_init(&f);
        int r = walk_classify(c, s, obj, &f);
        if (r < 0) {
            goto error;
        }
        if (r == 0) {
            if (emit_leaf(leaves, nodes, mode, obj, c->leaf_node) < 0) {
                goto error;
            }
            if (mode == WALK_PATHS) {
                PyObject *p = seq_of(0, keys->v, keys->n);
                if (p == NULL || PyList_Append(w->paths, p) < 0) {
                    Py_XDECREF(p);
                    goto error;
                }
                Py_DECREF(p);
            }
        }
        else {
            if (mode != WALK_LEAVES) {
                if (f.dict_kind) {
                    PyObject *order = found_order(s, &f, obj);
                    if (order == NULL) {
                        goto found_error;
                    }
                    if (order != Py_None) {
                        if (w->orders == NULL && (w->orders = PyList_New(0)) == NULL) {
                            Py_DECREF(order);
                            goto found_error;
                        }
                        PyObject *pair = kept_pair(c->st, nodes->n, order, f.order_kept);
                        if (pair == NULL || PyList_Append(w->orders, pair) < 0) {
                            Py_XDECREF(pair);
                            goto found_error;
                        }
                        Py_DECREF(pair);
                    }
                    else {
                        Py_DECREF(order);
                    }
                }
                PyObject *node = f.node;
                f.node = NULL;
                if (vec_push(nodes, node) < 0) {
                    goto found_error;
                }
            }
            Py_ssize_t nch = PyTuple_Check(f.children) ? PyTuple_GET_SIZE(f.children)
                                                        : PyList_GET_SIZE(f.children);
            if (nch) {
                int held = stack_holds(s, obj);
                if (held < 0) {
                    goto found_error;
                }
                if (held) {
                    PyObject *st = stack_py(s);
                    if (st != NULL) {
                        raise_returned(PyObject_CallFunctionObjArgs(py_cycle_error, st, obj, NULL));
                        Py_DECREF(st);
                    }
                    goto found_error;
                }
                if (stack_push(s, obj, f.children, f.names, f.keymode, f.live, 1) < 0) {
                    Py_XDECREF(f.node);
                    goto error;
                }
            }
            else {
                Py_DECREF(f.children);
                Py_XDECREF(f.names);
                Py_ssize_t i = 0;
                while (i < f.direct_n &&
                       emit_leaf(leaves, nodes, mode, f.direct[i], c->leaf_node) == 0) {
                    i++;
                }
                release_direct(&f);
                if (i < f.direct_n) {
                    Py_XDECREF(f.node);
                    goto error;
                }
            }
            Py_XDECREF(f.node);
            goto advance;
        found_error:
            release_direct(&f);
            Py_XDECREF(f.order);
            Py_XDECREF(f.node);
            Py_DECREF(f.children);
            Py_XDECREF(f.names);
            goto error;
        }
    advance:
        Py_CLEAR(obj);
        /* Move to the next value in pre-order. */
        Frame *fr;
        int more;
        while ((more = stack_unread(s, &fr)) > 0) {
            if (mode != WALK_PATHS && lazy != LAZY_TEST && c->is_leaf == NULL &&
                known_leaf(c, Py_TYPE(frame_item(fr, fr->pos)))) {
                /* A run of children that are leaves by their type: no user code
                 * runs, so they are copied in one go. The room reserved is at
                 * most what this frame's own children take. */
                if (fr->n - fr->pos == 1) {
                    /* the last child (as in [tree, leaf]): no run to copy */
                    if (emit_leaf(leaves, nodes, mode, frame_item(fr, fr->pos), c->leaf_node) < 0) {
                        goto error;
                    }
                    fr->pos++;
                }
                else if (leaf_run_out(c, fr, leaves, mode != WALK_LEAVES ? nodes : NULL) < 0) {
                    goto error;
                }
                if (fr->pos == fr->n) {
                    continue;
                }
            }
            Py_ssize_t i;
            if ((obj = frame_next(fr, &i)) == NULL) {
                goto error;
            }
            if (mode == WALK_PATHS) {
                PyObject *k = frame_key(fr, i);
                if (k == NULL) {
                    goto error;
                }
                while (keys->n > s->n - 1) {
                    Py_DECREF(keys->v[--keys->n]);
                }
                if (vec_push(keys, k) < 0) {
                    goto error;
                }
            }
            break;
        }
        if (more < 0) {
            goto error;
        }
        if (obj == NULL) {
            return 0;
        }
    }
error:
    w->obj = obj;
    return -1;
}

/* The leaves, and by mode the spec and the paths, as the caller gets them. */
static PyObject *
walk_result(Walk *w)
{
    const WalkMode mode = w->mode;
    PyObject *result = NULL;
    if (mode == WALK_LEAVES) {
        return vec_to_list(&w->leaves);
    }
    {
        Py_ssize_t nleaves = w->leaves.n;
        PyObject *tnodes = vec_to_tuple(&w->nodes);
        if (tnodes == NULL) {
            goto error;
        }
        PyObject *torders;
        if (w->orders == NULL) {
            Py_INCREF(empty_tuple);
            torders = empty_tuple;
        }
        else if ((torders = PyList_AsTuple(w->orders)) == NULL) {
            Py_DECREF(tnodes);
            goto error;
        }
        PyObject *spec = make_spec(tnodes, torders, nleaves);
        if (spec == NULL) {
            goto error;
        }
        if (mode == WALK_PATHS) {
            PyObject *pairs = PyList_New(nleaves);
            if (pairs == NULL) {
                Py_DECREF(spec);
                goto error;
            }
            for (Py_ssize_t i = 0; i < nleaves; i++) {
                PyObject *pr = PyTuple_Pack(2, PyList_GET_ITEM(w->paths, i), w->leaves.v[i]);
                if (pr == NULL) {
                    Py_DECREF(pairs);
                    Py_DECREF(spec);
                    goto error;
                }
                PyList_SET_ITEM(pairs, i, pr);
            }
            result = PyTuple_Pack(2, pairs, spec);
            Py_DECREF(pairs);
            Py_DECREF(spec);
        }
        else {
            PyObject *lst = vec_to_list(&w->leaves);
            result = lst == NULL ? NULL : PyTuple_Pack(2, lst, spec);
            Py_XDECREF(lst);
            Py_DECREF(spec);
        }
    }
    return result;
error:
    return NULL;
}

static PyObject *
walk(PkState *st, PyObject *tree, PyObject *is_leaf, PyObject *rules, WalkMode mode)
{
    Walk w;
    PyObject *result = NULL;
    if (walk_init(&w, st, tree, is_leaf, rules, mode) == 0 && walk_run(&w, EAGER) == 0) {
        result = walk_result(&w);
    }
    walk_clear(&w);
    return result;
}

/* flatten_with_path with an is_leaf that takes (path, value) */
static PyObject *
walk_paths_asking(PkState *st, PyObject *tree, PyObject *is_leaf, PyObject *rules)
{
    Walk w;
    PyObject *result = NULL;
    if (walk_init(&w, st, tree, is_leaf, rules, WALK_PATHS) == 0) {
        if (w.c.is_leaf != NULL) {
            w.c.path_keys = &w.keys;
        }
        if (walk_run(&w, EAGER) == 0) {
            result = walk_result(&w);
        }
    }
    walk_clear(&w);
    return result;
}

/* ------------------------------------------------------------------------ */
/* iter_leaves: the leaves, lazily */

/* An iterator over a tree's leaves, as _pure.iter_leaves yields them:
 * walk_run with lazy set, the Walk kept here between __next__ calls. It holds
 * the containers being read, the leaves found but not yet returned, is_leaf
 * and rules, all visited by the GC. Like a generator it refuses to be
 * re-entered (an is_leaf that calls next on it, or a second thread), and is
 * done after an error. */
typedef struct {
    PyObject_HEAD
    Walk w;
    PyObject *is_leaf; /* strong or NULL; w.c borrows it */
    PyObject *rules;   /* strong or NULL; w.c borrows it */
    Py_ssize_t next;   /* w.leaves[next:] are found and not yet returned */
    int state;         /* LI_WALKING, LI_RUNNING (in walk_run) or LI_DONE */
    PyObject *weakrefs; /* weak references to it, as to the pure engine's generator */
    PyObject *module;   /* strong: the module whose state w reads */
} LeafIter;

enum { LI_WALKING, LI_RUNNING, LI_DONE };


/* Drop everything it holds; it is done. Safe to call again. */
static void
leafiter_release(LeafIter *it)
{
    Walk *w = &it->w;
    Py_ssize_t k = it->next, n = w->leaves.n;
    it->state = LI_DONE;
    /* the leaves not returned: taken out first, as their release can run code */
    w->leaves.n = 0;
    it->next = 0;
    for (Py_ssize_t i = k; i < n; i++) {
        Py_DECREF(w->leaves.v[i]);
    }
    walk_clear(w);
    Py_CLEAR(it->is_leaf);
    Py_CLEAR(it->rules);
    Py_CLEAR(it->module);
}

static PyObject *
leafiter_next(LeafIter *it)
{
    Walk *w = &it->w;
    if (it->next < w->leaves.n) {
        PyObject *x = w->leaves.v[it->next++]; /* its reference moves to the caller */
        return x;
    }
    if (it->state == LI_RUNNING) {
        PyErr_SetString(PyExc_ValueError, "generator already executing");
        return NULL;
    }
    if (it->state == LI_DONE) {
        return NULL;
    }
    w->leaves.n = it->next = 0; /* every leaf found was returned */
    w->c.last_leaf = NULL;      /* the caller's code ran since the last call */
    it->state = LI_RUNNING;
    int r = walk_run(w, LAZY_YIELD);
    it->state = LI_WALKING;
    if (r < 0) {
        leafiter_release(it);
        return NULL;
    }
    if (r == 0) {
        it->state = LI_DONE; /* the leaves found last are still returned */
    }
    if (w->leaves.n == 0) {
        leafiter_release(it);
        return NULL;
    }
    it->next = 1;
    return w->leaves.v[0];
}

static int
leafiter_traverse(LeafIter *it, visitproc visit, void *arg)
{
    Walk *w = &it->w;
    Py_VISIT(it->is_leaf);
    Py_VISIT(it->rules);
    Py_VISIT(it->module);
    Py_VISIT(w->obj);
    Py_VISIT(w->c.pycache);
    for (Py_ssize_t i = it->next; i < w->leaves.n; i++) {
        Py_VISIT(w->leaves.v[i]);
    }
    for (Py_ssize_t i = 0; i < w->s.n; i++) {
        Py_VISIT(w->s.v[i].obj);
        Py_VISIT(w->s.v[i].children);
        Py_VISIT(w->s.v[i].names);
    }
    for (Py_ssize_t i = 0; i < w->c.types.n; i++) {
        TypeEntry *e = &w->c.types.v[i];
        Py_VISIT(e->type);
        Py_VISIT(e->info);
        Py_VISIT(e->node);
        Py_VISIT(e->reads_obj);
    }
    return 0;
}

static int
leafiter_clear(LeafIter *it)
{
    if (it->state != LI_RUNNING) { /* while running, its caller holds it */
        leafiter_release(it);
    }
    return 0;
}

static void
leafiter_dealloc(LeafIter *it)
{
    PyObject_GC_UnTrack(it);
    if (it->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)it);
    }
    leafiter_release(it);
    PyObject_GC_Del(it);
}

PK_DATA PyTypeObject LeafIter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pytree_kit._speedups.LeafIter",
    .tp_basicsize = sizeof(LeafIter),
    .tp_dealloc = (destructor)leafiter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The leaves of a tree, in order, found as they are asked for.",
    .tp_traverse = (traverseproc)leafiter_traverse,
    .tp_clear = (inquiry)leafiter_clear,
    .tp_weaklistoffset = offsetof(LeafIter, weakrefs),
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)leafiter_next,
};

/* iter_leaves(tree, is_leaf=None, rules=None): a LeafIter; nothing is read
 * until the first next */
PK_SHARED PyObject *
sp_iter_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError,
                        "iter_leaves(tree, is_leaf=None, rules=None) takes 1 to 3 arguments");
        return NULL;
    }
    PyObject *is_leaf = nargs > 1 ? args[1] : Py_None, *rules = nargs > 2 ? args[2] : Py_None;
    LeafIter *it = PyObject_GC_New(LeafIter, &LeafIter_Type);
    if (it == NULL) {
        return NULL;
    }
    it->weakrefs = NULL;
    it->module = NULL;
    it->is_leaf = is_leaf == Py_None ? NULL : Py_NewRef(is_leaf);
    it->rules = rules == Py_None ? NULL : Py_NewRef(rules);
    it->next = 0;
    it->state = LI_WALKING;
    it->module = Py_NewRef(self);
    if (walk_init(&it->w, pk_state(self), args[0], is_leaf, rules, WALK_LEAVES) < 0) {
        Py_DECREF(it);
        return NULL;
    }
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

/* ------------------------------------------------------------------------ */
/* any_leaf: tree_any and tree_all */

/* A leaf's truth when finding it runs no Python code (an exact None, bool,
 * int, float, complex, str or bytes): 0 or 1; else -2. */
static inline int
plain_truth(PyObject *x)
{
    PyTypeObject *t = Py_TYPE(x);
    if (x == Py_None || x == Py_False) {
        return 0;
    }
    if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type || t == &PyBytes_Type ||
        t == &PyBool_Type || t == &PyComplex_Type) {
        return PyObject_IsTrue(x); /* these types' own C slots: cannot fail */
    }
    return -2;
}

/* any_leaf(tree, is_leaf, rules, want): whether some leaf's truth is want
 * (tree_any with want true; tree_all is not any_leaf(..., False)), as
 * _pure.any_leaf: the leaves of iter_leaves, each tested as it is found,
 * stopping at the first that decides. A leaf of plain_truth's types is tested
 * where it is; before any other leaf's truth, which can run the caller's
 * code, the lists still being read are copied, as a LeafIter copies them
 * before it returns a leaf. So no list is copied on a tree of plain leaves. */
PK_SHARED PyObject *
sp_any_leaf(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "any_leaf(tree, is_leaf, rules, want) takes 4 arguments");
        return NULL;
    }
    int want = PyObject_IsTrue(args[3]);
    if (want < 0) {
        return NULL;
    }
    Walk w;
    int found = 0, r = walk_init(&w, pk_state(self), args[0], args[1], args[2], WALK_LEAVES);
    while (r == 0) {
        r = walk_run(&w, LAZY_TEST);
        if (r < 0) {
            break;
        }
        Py_ssize_t n = w.leaves.n;
        for (Py_ssize_t i = 0; i < n && !found && r >= 0; i++) {
            PyObject *x = w.leaves.v[i];
            int t = plain_truth(x);
            if (t == -2) {
                /* the caller's code may run: as after a LeafIter's next */
                t = stack_freeze(&w.s) < 0 ? -1 : PyObject_IsTrue(x);
                w.c.last_leaf = NULL;
            }
            if (t < 0) {
                r = -1;
            }
            found = t == want;
        }
        /* the leaves taken out first, as their release can run code */
        w.leaves.n = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_DECREF(w.leaves.v[i]);
        }
        if (found || r <= 0) {
            break;
        }
        r = 0;
    }
    walk_clear(&w);
    return r < 0 ? NULL : PyBool_FromLong(found);
}

/* ------------------------------------------------------------------------ */
/* flatten_one_level: the root alone */

/* flatten_one_level(tree, is_leaf=None, rules=None): (children, spec) of
 * the root, the spec its node over a leaf per child, or None when the root
 * is a leaf; as _pure.flatten_one_level, by the walk's own classification of
 * the root (walk_classify) and its dict order (found_order). */
PK_SHARED PyObject *
sp_flatten_one_level(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError,
                        "flatten_one_level(tree, is_leaf=None, rules=None) takes 1 to 3 arguments");
        return NULL;
    }
    PyObject *tree = args[0];
    PyObject *is_leaf = nargs > 1 ? args[1] : Py_None, *rules = nargs > 2 ? args[2] : Py_None;
    PyObject *result = NULL, *children = NULL, *nodes = NULL, *orders = NULL, *order = NULL;
    Ctx c;
    Stack s;
    Found f;
    int r, found = 0;
    stack_init(&s, pk_state(self));
    found_init(&f);
    if (ctx_init(&c, pk_state(self), is_leaf, rules, WALK_SPEC) < 0) {
        goto done;
    }
    r = walk_classify(&c, &s, tree, &f);
    if (r <= 0) {
        result = r < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    found = 1; /* f holds its node, children and names */
    /* the children: a record's or dict's leaves given directly, else f's */
    Py_ssize_t n;
    if (f.direct_n) {
        n = f.direct_n;
        children = PyList_New(n);
        for (Py_ssize_t i = 0; children != NULL && i < n; i++) {
            PyList_SET_ITEM(children, i, Py_NewRef(f.direct[i]));
        }
    }
    else {
        children = PySequence_List(f.children);
    }
    if (children == NULL) {
        goto done;
    }
    n = PyList_GET_SIZE(children);
    if (f.dict_kind && (order = found_order(&s, &f, tree)) == NULL) {
        goto done;
    }
    if (order != NULL && order != Py_None) {
        orders = Py_BuildValue("((nO))", (Py_ssize_t)0, order);
    }
    else {
        orders = Py_NewRef(empty_tuple);
    }
    if (orders == NULL || (nodes = PyTuple_New(n + 1)) == NULL) {
        goto done;
    }
    PyTuple_SET_ITEM(nodes, 0, Py_NewRef(f.node));
    for (Py_ssize_t i = 1; i <= n; i++) {
        PyTuple_SET_ITEM(nodes, i, Py_NewRef(c.leaf_node));
    }
    PyObject *spec = make_spec(nodes, orders, n); /* steals both */
    nodes = orders = NULL;
    if (spec != NULL) {
        result = PyTuple_Pack(2, children, spec);
        Py_DECREF(spec);
    }
done:
    if (found) {
        release_direct(&f);
        Py_XDECREF(f.order);
        Py_XDECREF(f.node);
        Py_XDECREF(f.children);
        Py_XDECREF(f.names);
    }
    Py_XDECREF(order);
    Py_XDECREF(orders);
    Py_XDECREF(nodes);
    Py_XDECREF(children);
    stack_clear(&s);
    ctx_clear(&c);
    return result;
}

/* fname(tree, is_leaf=None, rules=None): walk in the given mode */
static PyObject *
walk_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, const char *fname,
          WalkMode mode)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s(tree, is_leaf=None, rules=None) takes 1 to 3 arguments",
                     fname);
        return NULL;
    }
    return walk(pk_state(self), args[0], nargs > 1 ? args[1] : Py_None,
                nargs > 2 ? args[2] : Py_None, mode);
}

PK_SHARED PyObject *
sp_flatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return walk_call(self, args, nargs, "flatten", WALK_SPEC);
}

PK_SHARED PyObject *
sp_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return walk_call(self, args, nargs, "leaves", WALK_LEAVES);
}

/* flatten_with_path(tree, is_leaf=None, rules=None, is_leaf_takes_path=False) */
PK_SHARED PyObject *
sp_flatten_with_path(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "flatten_with_path(tree, is_leaf=None, rules=None, "
                                         "is_leaf_takes_path=False) takes 1 to 4 arguments");
        return NULL;
    }
    if (nargs != 4) {
        return walk_call(self, args, nargs, "flatten_with_path", WALK_PATHS);
    }
    int takes_path = PyObject_IsTrue(args[3]);
    if (takes_path < 0) {
        return NULL;
    }
    return takes_path ? walk_paths_asking(pk_state(self), args[0], args[1], args[2])
                      : walk(pk_state(self), args[0], args[1], args[2], WALK_PATHS);
}

/* the entry points FastCall calls (_speedups.h) */
PyObject *
pk_walk(PkState *st, PyObject *tree, PyObject *is_leaf, PyObject *rules, WalkMode mode)
{
    return walk(st, tree, is_leaf, rules, mode);
}
