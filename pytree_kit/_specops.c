/* The spec algebra on node tuples, spec_compose, spec_is_prefix and
 * spec_paths, tree_get's path_get, and keystr. pytree_kit/_pure.py's functions of the same names
 * are the specification (read them first); these give the same results.
 * TreeSpec's compose, is_prefix (and the order operators) and paths call
 * whichever engine runs; _keys.keystr calls this keystr for its default
 * options when the C engine runs.
 *
 * Nodes are read with pk_node_parts (malformed ones raise ValueError, as
 * unflatten does); path keys are made with pk_key. Every loop is over the
 * node tuple, with explicit stacks: no C recursion.
 *
 * Calls: pk_node_parts, pk_key (_speedups.c); _spec.child_key for the keys
 * of custom, rule and structseq nodes.
 */
#include "_speedups.h"

/* "[0]" to "[255]", made once: the text of SequenceKey(i) for small i */
#define SMALL_INDEX 256
static PyObject *index_text[SMALL_INDEX];

/* set by pk_specops_init */
static PyObject *s_key, *s_idx, *s_name, *s_empty, *s_lbracket, *s_rbracket, *s_dot;

/* The index just past the subtree whose root is nodes[start], as
 * _spec._subtree_end; -1 with ValueError when the tuple ends first. */
static Py_ssize_t
subtree_end(PyObject *nodes, Py_ssize_t start)
{
    Py_ssize_t need = 1, i = start, n = PyTuple_GET_SIZE(nodes);
    while (need) {
        int kind;
        Py_ssize_t arity;
        if (i >= n) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: a subtree runs past its end");
            return -1;
        }
        if (pk_node_parts(PyTuple_GET_ITEM(nodes, i), &kind, &arity) < 0) {
            return -1;
        }
        need += arity - 1;
        i++;
    }
    return i;
}

static int
exact_tuples(const char *fname, PyObject *const *args, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyTuple_CheckExact(args[i])) {
            PyErr_Format(PyExc_TypeError, "%s: argument %zd must be a tuple, not %.100s", fname,
                         i + 1, Py_TYPE(args[i])->tp_name);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* spec_compose(outer_nodes, outer_orders, inner_nodes, inner_orders)
 *   -> (nodes, orders): every leaf of outer replaced by inner's nodes. */

/* Append (position, order) to out, a list. */
static int
add_order(PyObject *out, Py_ssize_t position, PyObject *order)
{
    PyObject *pair = Py_BuildValue("(nO)", position, order);
    if (pair == NULL) {
        return -1;
    }
    int r = PyList_Append(out, pair);
    Py_DECREF(pair);
    return r;
}

/* The order (index, keys) pairs give node i, or NULL (borrowed): omap is
 * dict(orders), as the specification reads them, or NULL for none. */
static int
order_at(PyObject *omap, Py_ssize_t i, PyObject **order)
{
    *order = NULL;
    if (omap == NULL) {
        return 0;
    }
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL) {
        return -1;
    }
    *order = PyDict_GetItemWithError(omap, key);
    Py_DECREF(key);
    return *order == NULL && PyErr_Occurred() ? -1 : 0;
}

PyObject *
pk_spec_compose(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "spec_compose(outer_nodes, outer_orders, inner_nodes, inner_orders) "
                        "takes 4 arguments");
        return NULL;
    }
    if (exact_tuples("spec_compose", args, 4) < 0) {
        return NULL;
    }
    PyObject *outer = args[0], *outer_orders = args[1], *inner = args[2],
             *inner_orders = args[3];
    Py_ssize_t n_outer = PyTuple_GET_SIZE(outer), n_inner = PyTuple_GET_SIZE(inner);
    Py_ssize_t n_inner_orders = PyTuple_GET_SIZE(inner_orders);
    /* count the outer leaves first: the result's size is known */
    Py_ssize_t leaves = 0;
    for (Py_ssize_t i = 0; i < n_outer; i++) {
        int kind;
        Py_ssize_t arity;
        if (pk_node_parts(PyTuple_GET_ITEM(outer, i), &kind, &arity) < 0) {
            return NULL;
        }
        leaves += kind == K_LEAF;
    }
    if (n_inner > 1 && leaves > (PY_SSIZE_T_MAX - n_outer) / (n_inner - 1)) {
        return PyErr_NoMemory();
    }
    PyObject *omap = NULL, *orders = NULL;
    PyObject *nodes = PyTuple_New(n_outer + leaves * (n_inner - 1));
    if (nodes == NULL || (orders = PyList_New(0)) == NULL) {
        goto error;
    }
    if (PyTuple_GET_SIZE(outer_orders) &&
        ((omap = PyDict_New()) == NULL || PyDict_MergeFromSeq2(omap, outer_orders, 1) < 0)) {
        goto error;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n_outer; i++) {
        PyObject *node = PyTuple_GET_ITEM(outer, i), *order;
        int kind;
        Py_ssize_t arity;
        (void)pk_node_parts(node, &kind, &arity); /* checked above */
        if (kind == K_LEAF) {
            for (Py_ssize_t j = 0; j < n_inner_orders; j++) {
                PyObject *pair = PyTuple_GET_ITEM(inner_orders, j);
                if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    PyErr_SetString(PyExc_ValueError,
                                    "malformed TreeSpec: an order is not (index, keys)");
                    goto error;
                }
                Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
                if ((k == -1 && PyErr_Occurred()) ||
                    add_order(orders, at + k, PyTuple_GET_ITEM(pair, 1)) < 0) {
                    goto error;
                }
            }
            for (Py_ssize_t j = 0; j < n_inner; j++) {
                PyObject *x = PyTuple_GET_ITEM(inner, j);
                Py_INCREF(x);
                PyTuple_SET_ITEM(nodes, at++, x);
            }
            continue;
        }
        if (order_at(omap, i, &order) < 0 ||
            (order != NULL && add_order(orders, at, order) < 0)) {
            goto error;
        }
        Py_INCREF(node);
        PyTuple_SET_ITEM(nodes, at++, node);
    }
    Py_XDECREF(omap);
    PyObject *torders = PyList_AsTuple(orders);
    Py_DECREF(orders);
    if (torders == NULL) {
        Py_DECREF(nodes);
        return NULL;
    }
    return Py_BuildValue("(NN)", nodes, torders);
error:
    Py_XDECREF(nodes); /* unset items are NULL, which tuple_dealloc skips */
    Py_XDECREF(orders);
    Py_XDECREF(omap);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* spec_is_prefix(mine, theirs) -> bool: every container node of mine stands,
 * equal, where theirs has it, and every leaf of mine stands for a subtree */

PyObject *
pk_spec_is_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "spec_is_prefix(mine, theirs) takes 2 arguments");
        return NULL;
    }
    if (exact_tuples("spec_is_prefix", args, 2) < 0) {
        return NULL;
    }
    PyObject *mine = args[0], *theirs = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(mine), n_theirs = PyTuple_GET_SIZE(theirs), j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyTuple_GET_ITEM(mine, i);
        int kind;
        Py_ssize_t arity;
        if (pk_node_parts(node, &kind, &arity) < 0) {
            return NULL;
        }
        if (kind == K_LEAF) {
            if ((j = subtree_end(theirs, j)) < 0) {
                return NULL;
            }
            continue;
        }
        if (j >= n_theirs) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return NULL;
        }
        /* node != theirs[j], as the specification writes it */
        PyObject *other = PyTuple_GET_ITEM(theirs, j);
        Py_INCREF(other);
        int ne = PyObject_RichCompareBool(node, other, Py_NE);
        Py_DECREF(other);
        if (ne < 0) {
            return NULL;
        }
        if (ne) {
            Py_RETURN_FALSE;
        }
        j++;
    }
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------------------ */
/* spec_paths(nodes) -> [path of each leaf] */

/* _spec.child_key(node, i), asked for the kinds whose keys are not read here
 * (custom, rule, structseq); set by pk_specops_init */
static PyObject *py_child_key;

int
pk_specops_init(PyObject *spec_module)
{
    py_child_key = PyObject_GetAttrString(spec_module, "child_key");
    s_key = PyUnicode_InternFromString("key");
    s_idx = PyUnicode_InternFromString("idx");
    s_name = PyUnicode_InternFromString("name");
    s_empty = PyUnicode_FromString("");
    s_lbracket = PyUnicode_FromString("[");
    s_rbracket = PyUnicode_FromString("]");
    s_dot = PyUnicode_FromString(".");
    if (!(py_child_key && s_key && s_idx && s_name && s_empty && s_lbracket && s_rbracket &&
          s_dot)) {
        return -1;
    }
    for (int i = 0; i < SMALL_INDEX; i++) {
        if ((index_text[i] = PyUnicode_FromFormat("[%d]", i)) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Path keys are values (immutable, compared by what they hold), so one
 * call shares them between paths: SequenceKey(i) is made once for each i,
 * and a named node's keys once for each tuple of names (dict nodes with the
 * same keys share that tuple when the walk made them). */
#define NAMED_CACHE 32

typedef struct {
    PyObject **seq; /* strong: SequenceKey(0), SequenceKey(1), ... */
    Py_ssize_t nseq, seq_cap;
    struct {
        PyObject *names; /* strong or NULL */
        int which;
        PyObject *keys; /* strong: a tuple of the keys of names */
    } named[NAMED_CACHE];
} Keys;

static void
keys_clear(Keys *k)
{
    for (Py_ssize_t i = 0; i < k->nseq; i++) {
        Py_DECREF(k->seq[i]);
    }
    PyMem_Free(k->seq);
    for (int i = 0; i < NAMED_CACHE; i++) {
        Py_XDECREF(k->named[i].names);
        Py_XDECREF(k->named[i].keys);
    }
}

/* SequenceKey(i), borrowed from k */
static PyObject *
seq_key(Keys *k, Py_ssize_t i)
{
    while (k->nseq <= i) {
        if (k->nseq == k->seq_cap) {
            Py_ssize_t cap = k->seq_cap ? 2 * k->seq_cap : 16;
            PyObject **v = PyMem_Realloc(k->seq, sizeof(PyObject *) * (size_t)cap);
            if (v == NULL) {
                PyErr_NoMemory();
                return NULL;
            }
            k->seq = v;
            k->seq_cap = cap;
        }
        PyObject *idx = PyLong_FromSsize_t(k->nseq);
        if (idx == NULL) {
            return NULL;
        }
        PyObject *key = pk_key(PK_KEY_SEQUENCE, idx);
        Py_DECREF(idx);
        if (key == NULL) {
            return NULL;
        }
        k->seq[k->nseq++] = key;
    }
    return k->seq[i];
}

/* The keys of a named node's children (a tuple, strong), from its names:
 * the dict keys, or the field names. NULL with an error set. */
static PyObject *
named_keys(Keys *k, PyObject *names, int which, Py_ssize_t arity)
{
    if (names == NULL || !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) < arity) {
        PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: a node's keys do not match it");
        return NULL;
    }
    int slot = (int)(((uintptr_t)names >> 4) % NAMED_CACHE);
    if (k->named[slot].names == names && k->named[slot].which == which &&
        PyTuple_GET_SIZE(k->named[slot].keys) >= arity) {
        return Py_NewRef(k->named[slot].keys);
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *keys = PyTuple_New(n);
    if (keys == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = pk_key(which, PyTuple_GET_ITEM(names, i));
        if (key == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyTuple_SET_ITEM(keys, i, key);
    }
    Py_XSETREF(k->named[slot].names, Py_NewRef(names));
    Py_XSETREF(k->named[slot].keys, Py_NewRef(keys));
    k->named[slot].which = which;
    return keys;
}

/* How a node names its children: *named gets the tuple of their keys
 * (strong) for a dict, namedtuple, dataclass or attrs node, and stays NULL
 * for the others (sequence keys, or the specification's child_key). */
static int
node_keys(Keys *k, PyObject *node, int kind, Py_ssize_t arity, PyObject **named)
{
    PyObject *aux = PyTuple_GET_ITEM(node, 3), *names = NULL;
    int which = PK_KEY_DICT;
    *named = NULL;
    switch (kind) {
    case K_DICT:
    case K_ORDEREDDICT:
        names = aux;
        break;
    case K_DEFAULTDICT:
        names = PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == 2 ? PyTuple_GET_ITEM(aux, 1)
                                                                      : NULL;
        break;
    case K_NAMEDTUPLE:
        names = aux;
        which = PK_KEY_ATTR;
        break;
    case K_DATACLASS:
    case K_ATTRS:
        names = PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) >= 1 ? PyTuple_GET_ITEM(aux, 0)
                                                                      : NULL;
        which = PK_KEY_ATTR;
        break;
    default:
        return 0;
    }
    *named = named_keys(k, names, which, arity);
    return *named == NULL ? -1 : 0;
}

typedef struct {
    PyObject *node; /* borrowed from the nodes tuple */
    int kind;
    Py_ssize_t arity, done;
    PyObject *named; /* strong or NULL: node_keys's */
} PathFrame;

/* The key of the frame's next child (strong). */
static PyObject *
frame_next_key(Keys *k, PathFrame *fr)
{
    Py_ssize_t i = fr->done++;
    if (fr->named != NULL) {
        return Py_NewRef(PyTuple_GET_ITEM(fr->named, i));
    }
    if (fr->kind == K_TUPLE || fr->kind == K_LIST || fr->kind == K_DEQUE) {
        return Py_XNewRef(seq_key(k, i));
    }
    /* custom, rule, structseq: the specification's own answer */
    PyObject *idx = PyLong_FromSsize_t(i);
    if (idx == NULL) {
        return NULL;
    }
    PyObject *key = PyObject_CallFunctionObjArgs(py_child_key, fr->node, idx, NULL);
    Py_DECREF(idx);
    return key;
}

PyObject *
pk_spec_paths(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "spec_paths(nodes) takes 1 argument");
        return NULL;
    }
    if (exact_tuples("spec_paths", args, 1) < 0) {
        return NULL;
    }
    PyObject *nodes = args[0];
    Py_ssize_t n = PyTuple_GET_SIZE(nodes);
    /* the path is at most as deep as there are nodes */
    PathFrame *frames = PyMem_Malloc(sizeof(PathFrame) * (size_t)(n ? n : 1));
    PyObject **path = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
    Py_ssize_t nframes = 0, depth = 0;
    Keys k;
    memset(&k, 0, sizeof(k));
    PyObject *out = PyList_New(0);
    if (frames == NULL || path == NULL || out == NULL) {
        if (out != NULL) {
            PyErr_NoMemory();
        }
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyTuple_GET_ITEM(nodes, i);
        int kind;
        Py_ssize_t arity;
        if (pk_node_parts(node, &kind, &arity) < 0) {
            goto error;
        }
        if (nframes) {
            PyObject *key = frame_next_key(&k, &frames[nframes - 1]);
            if (key == NULL) {
                goto error;
            }
            path[depth++] = key;
        }
        if (kind == K_LEAF) {
            PyObject *p = PyTuple_New(depth);
            if (p == NULL) {
                goto error;
            }
            for (Py_ssize_t j = 0; j < depth; j++) {
                PyTuple_SET_ITEM(p, j, Py_NewRef(path[j]));
            }
            int r = PyList_Append(out, p);
            Py_DECREF(p);
            if (r < 0) {
                goto error;
            }
        }
        if (arity) {
            PathFrame *fr = &frames[nframes];
            if (node_keys(&k, node, kind, arity, &fr->named) < 0) {
                goto error;
            }
            fr->node = node;
            fr->kind = kind;
            fr->arity = arity;
            fr->done = 0;
            nframes++;
            continue;
        }
        /* this node is done: so is every frame whose last child it was */
        if (nframes) {
            Py_DECREF(path[--depth]);
        }
        while (nframes && frames[nframes - 1].done == frames[nframes - 1].arity) {
            Py_XDECREF(frames[--nframes].named);
            if (nframes) {
                Py_DECREF(path[--depth]);
            }
        }
    }
    goto done;
error:
    Py_CLEAR(out);
done:
    while (depth) {
        Py_DECREF(path[--depth]);
    }
    while (nframes) {
        Py_XDECREF(frames[--nframes].named);
    }
    keys_clear(&k);
    PyMem_Free(path);
    PyMem_Free(frames);
    return out;
}

/* ------------------------------------------------------------------------ */
/* path_get(tree, path) -> (node, done) */

/* tree_get's reading of builtin containers, as _pure.path_get: down path (a
 * tuple) from tree while each node is an exact dict read by a DictKey or an
 * exact list or tuple read by a SequenceKey of an int in range; (the node
 * reached, how many keys were read). A key a dict lacks, or one it cannot
 * hash (KeyError or TypeError from the lookup), stops the reading as any
 * other key would; any other error from the lookup (a key's own __eq__ or
 * __hash__) is raised. */
PyObject *
pk_path_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "path_get(tree, path: tuple) takes 2 arguments");
        return NULL;
    }
    PyObject *path = args[1], *node = Py_NewRef(args[0]);
    PyObject *dict_key = pk_key_class(PK_KEY_DICT), *seq_key_t = pk_key_class(PK_KEY_SEQUENCE);
    Py_ssize_t done = 0, n = PyTuple_GET_SIZE(path);
    for (; done < n; done++) {
        PyObject *key = PyTuple_GET_ITEM(path, done), *next = NULL;
        PyTypeObject *t = Py_TYPE(node);
        if (t == &PyDict_Type) {
            if ((PyObject *)Py_TYPE(key) != dict_key) {
                break;
            }
            PyObject *k = pk_key_value(PK_KEY_DICT, key);
            if (k == NULL) {
                Py_DECREF(node);
                return NULL;
            }
            next = PyDict_GetItemWithError(node, k); /* borrowed */
            Py_DECREF(k);
            if (next == NULL) {
                if (PyErr_Occurred()) {
                    if (!PyErr_ExceptionMatches(PyExc_KeyError) &&
                        !PyErr_ExceptionMatches(PyExc_TypeError)) {
                        Py_DECREF(node);
                        return NULL;
                    }
                    PyErr_Clear();
                }
                break;
            }
            Py_INCREF(next);
        }
        else if (t == &PyList_Type || t == &PyTuple_Type) {
            if ((PyObject *)Py_TYPE(key) != seq_key_t) {
                break;
            }
            PyObject *idx = pk_key_value(PK_KEY_SEQUENCE, key);
            if (idx == NULL) {
                Py_DECREF(node);
                return NULL;
            }
            Py_ssize_t i = -1, size = Py_SIZE(node);
            if (PyLong_CheckExact(idx)) {
                int overflow;
                long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
                i = overflow || v < 0 || v >= size ? -1 : (Py_ssize_t)v;
            }
            Py_DECREF(idx);
            if (i < 0) {
                break;
            }
            next = Py_NewRef(t == &PyList_Type ? PyList_GET_ITEM(node, i) : PyTuple_GET_ITEM(node, i));
        }
        else {
            break;
        }
        Py_SETREF(node, next);
    }
    PyObject *count = PyLong_FromSsize_t(done), *r = count ? PyTuple_New(2) : NULL;
    if (r == NULL) {
        Py_XDECREF(count);
        Py_DECREF(node);
        return NULL;
    }
    PyTuple_SET_ITEM(r, 0, node);
    PyTuple_SET_ITEM(r, 1, count);
    return r;
}

/* ------------------------------------------------------------------------ */
/* keystr(path) -> "".join(map(str, path)), with the three key classes'
 * __str__ written here: DictKey "[repr(key)]", SequenceKey "[idx]" for an
 * int, GetAttrKey ".name" for a str. Anything else (a subclass, a key of
 * another library, another value) is str() of it. */

/* Append key's text to parts, as pieces: "[", repr(key), "]" for a DictKey,
 * ".", name for a GetAttrKey whose name is a str, "[i]" for a SequenceKey
 * of an int; else str(key), checked to be a str. */
static int
key_text(PyObject *parts, PyObject *key)
{
    PyObject *t = (PyObject *)Py_TYPE(key), *v = NULL, *pieces[3] = {NULL, NULL, NULL};
    int np = 0;
    if (t == pk_key_class(PK_KEY_DICT)) {
        if ((v = PyObject_GetAttr(key, s_key)) == NULL) {
            return -1;
        }
        pieces[0] = Py_NewRef(s_lbracket);
        pieces[1] = PyObject_Repr(v);
        pieces[2] = Py_NewRef(s_rbracket);
        np = 3;
    }
    else if (t == pk_key_class(PK_KEY_SEQUENCE)) {
        if ((v = PyObject_GetAttr(key, s_idx)) == NULL) {
            return -1;
        }
        if (PyLong_CheckExact(v)) {
            int overflow;
            long i = PyLong_AsLongAndOverflow(v, &overflow);
            if (!overflow && i >= 0 && i < SMALL_INDEX && index_text[i] != NULL) {
                pieces[0] = Py_NewRef(index_text[i]);
                np = 1;
            }
            else {
                pieces[0] = PyUnicode_FromFormat("[%S]", v);
                np = 1;
            }
        }
    }
    else if (t == pk_key_class(PK_KEY_ATTR)) {
        if ((v = PyObject_GetAttr(key, s_name)) == NULL) {
            return -1;
        }
        if (PyUnicode_CheckExact(v)) {
            pieces[0] = Py_NewRef(s_dot);
            pieces[1] = Py_NewRef(v);
            np = 2;
        }
    }
    Py_XDECREF(v);
    if (np == 0) { /* anything else: its own str */
        pieces[0] = PyObject_Str(key);
        np = 1;
        if (pieces[0] != NULL && !PyUnicode_Check(pieces[0])) {
            PyErr_Format(PyExc_TypeError, "__str__ returned non-string (type %.200s)",
                         Py_TYPE(pieces[0])->tp_name);
            Py_CLEAR(pieces[0]);
        }
    }
    int r = 0;
    for (int i = 0; i < np; i++) {
        if (r == 0 && (pieces[i] == NULL || PyList_Append(parts, pieces[i]) < 0)) {
            r = -1;
        }
        Py_XDECREF(pieces[i]);
    }
    return r;
}

PyObject *
pk_keystr(PyObject *self, PyObject *path)
{
    /* a tuple or list as it is; any other iterable read into a list first,
     * with iteration's own errors */
    PyObject *seq = PyTuple_CheckExact(path) || PyList_CheckExact(path) ? Py_NewRef(path)
                                                                         : PySequence_List(path);
    if (seq == NULL) {
        return NULL;
    }
    PyObject *parts = PyList_New(0), *out = NULL;
    if (parts == NULL) {
        goto done;
    }
    /* a list may change under str() or repr(): read it again each time */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        int r = key_text(parts, key);
        Py_DECREF(key);
        if (r < 0) {
            goto done;
        }
    }
    out = PyUnicode_Join(s_empty, parts);
done:
    Py_DECREF(seq);
    Py_XDECREF(parts);
    return out;
}
