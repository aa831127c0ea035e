/* _fast_odict_links.c: the fast path odict_links, an OrderedDict's own
 * order read from its linked list of keys.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: ODICT_LINKS (_core.h: 3.10 to 3.15, GIL
 * builds). Checked on import by odict_links_check, which sets odict_links_ok;
 * off, odict_in_dict_order answers -1 and the callers iterate the
 * OrderedDict with its own iterator. What it buys over the portable core
 * (benchmarks/fast_paths.py): up to 4.72x on 3.11.7 and
 * 4.75x on 3.13.0 (a state_dict of 1,000 as an OrderedDict, flatten_up_to),
 * 1.11x on 3.14.10 and 3.15.2 (a 2-layer ModelOutput: those runs count the
 * first 2 sizes, not the OrderedDict state_dict).
 *   odict_in_dict_order  whether an OrderedDict's order is its dict's
 *   odict_links_check    the import-time check
 * Callers: _classify.c, _up_to.c.
 * Calls: only the C API and _core.h (OrderedDict_t).
 */

#include "_core.h"

/* An OrderedDict's own order
 *
 * CPython's OrderedDict (Objects/odictobject.c, the same on 3.10 to 3.13) is
 * a dict followed by the head and tail of a doubly linked list of nodes, one
 * per key, in the OrderedDict's own order: the order its iterator follows,
 * which is the dict's insertion order unless move_to_end changed it. Reading
 * the list costs a pointer per key; iterating finds each key by its hash.
 * odict_links_check validates the layout on import. */

/* set on import by odict_links_check, where compiled */
PK_DATA int odict_links_ok;

#if ODICT_LINKS
typedef struct OdNode {
    PyObject *key; /* strong */
    Py_hash_t hash;
    struct OdNode *next, *prev;
} OdNode;

typedef struct {
    PyDictObject od_dict;
    OdNode *od_first, *od_last;
    OdNode **od_fast_nodes;
    Py_ssize_t od_fast_nodes_size;
    void *od_resize_sentinel;
    size_t od_state;
    PyObject *od_inst_dict, *od_weakreflist;
} OdObject;
#endif

/* For obj, an instance of OrderedDict or a subclass: 1 when its own order is
 * its dict's insertion order (the keys PyDict_Next gives, the same objects in
 * the same order, and no other), 0 when it is not, -1 when the layout is not
 * known here (the caller iterates). Runs no code; reads at most one node
 * more than the dict has keys. */
PK_SHARED int
odict_in_dict_order(PyObject *obj)
{
#if ODICT_LINKS
    if (odict_links_ok) {
        const OdNode *node = ((OdObject *)obj)->od_first;
        Py_ssize_t pos = 0;
        PyObject *k;
        while (PyDict_Next(obj, &pos, &k, NULL)) {
            if (node == NULL || node->key != k) {
                return 0;
            }
            node = node->next;
        }
        return node == NULL;
    }
#endif
    (void)obj;
    return -1;
}

#if ODICT_LINKS
/* The keys of od's linked list, first to last, as a new list (its prev links
 * and last node checked too), or NULL (with no error set) when they do not
 * link up; at most limit of them. */
static PyObject *
odict_links_keys(PyObject *od, Py_ssize_t limit)
{
    const OdObject *o = (const OdObject *)od;
    const OdNode *node = o->od_first, *prev = NULL;
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && node != NULL; i++) {
        Py_hash_t h = PyObject_Hash(node->key);
        if (i == limit || node->prev != prev || h == -1 || h != node->hash ||
            PyList_Append(keys, node->key) < 0) {
            Py_CLEAR(keys);
            break;
        }
        prev = node;
        node = node->next;
    }
    if (keys != NULL && o->od_last != prev) {
        Py_CLEAR(keys);
    }
    PyErr_Clear();
    return keys;
}

/* Sets odict_links_ok when OrderedDict's instances are laid out as OdObject
 * says (its size; an empty one's list empty) and their lists read as its
 * iterator reads them: str and int keys, after inserts, a move_to_end each
 * way, a delete and a re-insert, in an OrderedDict and in an instance of a
 * subclass; and odict_in_dict_order tells which of them are in their dict's
 * order. A failure of any kind leaves it off. */
PK_SHARED void
odict_links_check(void)
{
    PyTypeObject *t = (PyTypeObject *)OrderedDict_t;
    PyObject *sub = NULL, *bases = NULL;
    int ok = t->tp_basicsize == (Py_ssize_t)sizeof(OdObject);
    odict_links_ok = 1;
    bases = ok ? PyTuple_Pack(1, OrderedDict_t) : NULL;
    sub = bases ? PyObject_CallFunction((PyObject *)&PyType_Type, "sO{}", "_ProbeOd", bases)
                : NULL;
    ok = ok && sub != NULL;
    for (int step = 0; ok && step < 12; step++) {
        PyObject *od = PyObject_CallNoArgs(step % 2 ? sub : OrderedDict_t), *it = NULL,
                 *listed = NULL, *want = NULL;
        int kind = step / 2; /* 0, 1: inserts; 2: move_to_end; 3: to the front; 4: delete,
                                re-insert; 5: int keys */
        listed = od ? odict_links_keys(od, 0) : NULL; /* none yet */
        ok = listed != NULL && PyList_GET_SIZE(listed) == 0 && ((OdObject *)od)->od_first == NULL;
        Py_CLEAR(listed);
        for (long i = 0; ok && i < (kind == 0 ? 3 : 40); i++) {
            PyObject *k = kind == 5 ? PyLong_FromLong(i * 7 - 50) : PyUnicode_FromFormat("k%ld", i);
            ok = k != NULL && PyObject_SetItem(od, k, Py_None) == 0;
            Py_XDECREF(k);
        }
        if (ok && (kind == 2 || kind == 3)) {
            PyObject *k = PyUnicode_FromString(kind == 2 ? "k1" : "k30");
            PyObject *r = k ? PyObject_CallMethod(od, "move_to_end", "OO", k,
                                                  kind == 2 ? Py_True : Py_False)
                            : NULL;
            ok = r != NULL;
            Py_XDECREF(r);
            Py_XDECREF(k);
        }
        if (ok && kind == 4) {
            PyObject *k = PyUnicode_FromString("k3");
            ok = k && PyObject_DelItem(od, k) == 0 && PyObject_SetItem(od, k, Py_True) == 0;
            Py_XDECREF(k);
        }
        it = ok ? PyObject_GetIter(od) : NULL;
        want = it ? PySequence_List(it) : NULL;
        listed = want ? odict_links_keys(od, PyDict_GET_SIZE(od)) : NULL;
        ok = listed != NULL && PyObject_RichCompareBool(listed, want, Py_EQ) == 1;
        for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(want); i++) {
            ok = PyList_GET_ITEM(want, i) == PyList_GET_ITEM(listed, i);
        }
        /* in their dict's order but after move_to_end */
        ok = ok && odict_in_dict_order(od) == (kind == 2 || kind == 3 ? 0 : 1);
        Py_XDECREF(listed);
        Py_XDECREF(want);
        Py_XDECREF(it);
        Py_XDECREF(od);
    }
    PyErr_Clear();
    odict_links_ok = ok;
    Py_XDECREF(sub);
    Py_XDECREF(bases);
}
#endif
