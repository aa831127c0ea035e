/* unflatten_bound: a lower bound for unflatten(), the least any one can do.
 *
 * Used by benchmarks/unflatten_bound.py only; not part of pytree_kit. The
 * structure is compiled ahead into a flat C array of nodes in post-order
 * (compile(plan)), so building reads one small struct per node and nothing
 * else: no spec, no checks of the leaves' count, no key sorting (a dict's keys
 * are its template's, in insertion order), no error paths worth the name. It
 * knows exact list, tuple and dict. Each dict is made the cheapest way known
 * here, chosen per Python by the script (the faster of the two):
 *   build0  PyDict_New, then PyDict_SetItem for each key (the public API);
 *   build1  a copy of a template's table, values written in place (the C
 *           engine's dict_from_template, on the same layouts: 3.10 to 3.13,
 *           str keys only);
 *   build2  a split table: the dict shares a keys table and has only its
 *           values of its own, as a copy of an instance's __dict__ has (the
 *           values laid out as Include/internal/pycore_dict.h says). On 3.10
 *           to 3.12 the shared table is a copy of the template's made a
 *           split table (of its few slots), as the C engine's split_tables
 *           make it; on 3.13, where the engine makes none, the shared keys of
 *           a class's instances (made for the node by the script, its
 *           attributes set in the node's order).
 * build1 and build2 read and write CPython's dict layouts as 3.10 to 3.13 lay
 * them out (LAYOUTS); on another version (3.14: dicts are tracked by the
 * collector from birth, among other changes) only build0 is made, its keys
 * read from the plan's tuple, and nothing of a dict's layout is read.
 * Every unflatten must make these objects and walk these nodes, so no real
 * one can be faster on the same tree; its time bounds every ratio to a peer.
 * Not thread-safe, not reentrant. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* the dict layouts below are those of 3.10 to 3.13 */
#define LAYOUTS (PY_VERSION_HEX < 0x030E0000)

#if PY_VERSION_HEX >= 0x030B0000
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size, dk_log2_index_bytes, dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable, dk_nentries;
    char dk_indices[];
} Keys;
#define INDEX_BYTES(k) ((size_t)1 << (k)->dk_log2_index_bytes)
#define SLOTS(k) ((size_t)1 << (k)->dk_log2_size)
#define STEP 2 /* (key, value) entries of a str-keyed table */
#define KEY0 0
#else
typedef struct {
    Py_ssize_t dk_refcnt, dk_size;
    void *dk_lookup;
    Py_ssize_t dk_usable, dk_nentries;
    char dk_indices[];
} Keys;
#define INDEX_BYTES(k)                                                                     \
    ((size_t)(k)->dk_size * ((k)->dk_size <= 0xff ? 1 : (k)->dk_size <= 0xffff ? 2          \
                             : (k)->dk_size <= 0xffffffff ? 4 : 8))
#define SLOTS(k) ((size_t)(k)->dk_size)
#define STEP 3 /* (hash, key, value) */
#define KEY0 1
#endif

enum { LEAF, LIST, TUPLE, DICT };
typedef struct {
    int kind;
    Py_ssize_t arity;
    PyObject *tmpl; /* DICT: its keys, inserted in order, each to None */
    PyObject **keys; /* DICT: the template's keys (LAYOUTS), else the items of names */
    PyObject *names; /* DICT: the keys tuple of the plan */
    size_t size; /* DICT: the template's table in bytes */
    PyObject *split; /* DICT, or NULL: (instance, its __dict__), a split table */
    Keys *shared; /* the shared keys build2 uses: split's __dict__'s (3.13), or
                   * (3.10-3.12) a copy of tmpl's table made a split table */
} Node;
typedef struct {
    Py_ssize_t n, leaves;
    Node nodes[];
} Plan;

#define MAXSTACK 100000
static PyObject *stack[MAXSTACK];

static void
plan_free(PyObject *cap)
{
    Plan *p = PyCapsule_GetPointer(cap, "plan");
    for (Py_ssize_t i = 0; p && i < p->n; i++) {
        Py_XDECREF(p->nodes[i].tmpl);
        Py_XDECREF(p->nodes[i].split);
        Py_XDECREF(p->nodes[i].names);
    }
    PyMem_Free(p);
}

/* plan: a tuple of (kind, arity, keys tuple or None[, split table or None]) in
 * post-order (the script's plan_of) */
static PyObject *
compile(PyObject *self, PyObject *plan)
{
    if (!PyTuple_Check(plan)) {
        PyErr_SetString(PyExc_TypeError, "plan: a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(plan), depth = 0;
    Plan *p = PyMem_Calloc(1, sizeof(Plan) + (size_t)n * sizeof(Node));
    if (p == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(p, "plan", plan_free);
    if (cap == NULL) {
        PyMem_Free(p);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Node *node = &p->nodes[i];
        PyObject *keys, *split = Py_None;
        int kind;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(plan, i), "inO|O", &kind, &node->arity, &keys,
                              &split)) {
            goto fail;
        }
        if (split != Py_None && LAYOUTS) {
            /* (instance, its __dict__): a split table whose keys are the node's, in order */
            PyObject *d = PyTuple_Check(split) && PyTuple_GET_SIZE(split) == 2
                              ? PyTuple_GET_ITEM(split, 1) : NULL;
            PyDictObject *mp = d != NULL && PyDict_CheckExact(d) ? (PyDictObject *)d : NULL;
            Keys *sk = mp != NULL ? (Keys *)mp->ma_keys : NULL;
            /* (where CPython did not make one, build2 is left out: split_ok) */
            if (sk != NULL && mp->ma_values != NULL && sk->dk_nentries == node->arity &&
                node->arity > 0) {
                node->split = Py_NewRef(split);
                node->shared = sk;
            }
        }
        node->kind = kind;
        p->n = i + 1;
        p->leaves += kind == LEAF;
        depth += kind == LEAF ? 1 : 1 - node->arity;
        if (depth > MAXSTACK) {
            PyErr_SetString(PyExc_ValueError, "too deep for the bound's stack");
            goto fail;
        }
        if (kind != DICT) {
            continue;
        }
        if ((node->tmpl = PyDict_New()) == NULL) {
            goto fail;
        }
        if (!PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != node->arity) {
            PyErr_SetString(PyExc_TypeError, "a dict's keys: a tuple of its arity");
            goto fail;
        }
        node->names = Py_NewRef(keys);
        for (Py_ssize_t j = 0; j < node->arity; j++) {
            if (PyDict_SetItem(node->tmpl, PyTuple_GET_ITEM(keys, j), Py_None) < 0) {
                goto fail;
            }
        }
#if !LAYOUTS
        node->keys = &PyTuple_GET_ITEM(keys, 0);
        continue;
#endif
        Keys *k = (Keys *)((PyDictObject *)node->tmpl)->ma_keys;
        node->keys = (PyObject **)(k->dk_indices + INDEX_BYTES(k)) + KEY0;
        node->size = sizeof(Keys) + INDEX_BYTES(k) + ((SLOTS(k) << 1) / 3) * STEP * sizeof(PyObject *);
#if PY_VERSION_HEX < 0x030D0000
        if (node->shared != NULL && SLOTS(k) <= 32) {
            /* the template's table made a split table (the C engine's way) */
            Keys *sk = PyObject_Malloc(node->size);
            if (sk == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            memcpy(sk, k, node->size);
            sk->dk_refcnt = 1 << 30; /* (never freed: a bound's tables live on) */
#if PY_VERSION_HEX >= 0x030B0000
            sk->dk_version = 0;
            sk->dk_kind = 2;
#else
            sk->dk_lookup = node->shared->dk_lookup; /* a split table's lookup */
#endif
            PyObject **e = (PyObject **)(sk->dk_indices + INDEX_BYTES(sk)) + KEY0;
            for (Py_ssize_t j = 0; j < node->arity; j++) {
                Py_INCREF(e[j * STEP]);
                e[j * STEP + 1] = NULL;
            }
            node->shared = sk;
        }
        else {
            Py_CLEAR(node->split); /* (no build2 for this plan: split_ok) */
            node->shared = NULL;
        }
#endif
    }
    return cap;
fail:
    Py_DECREF(cap);
    return NULL;
}

/* whether build2 can be used: every dict node has a split table */
static PyObject *
split_ok(PyObject *self, PyObject *cap)
{
    Plan *p = PyCapsule_GetPointer(cap, "plan");
    if (p == NULL) {
        return NULL;
    }
    if (!LAYOUTS) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        if (p->nodes[i].kind == DICT && p->nodes[i].split == NULL) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

/* whether build1 can be used for every dict of the plan on this Python: str
 * keys in a combined table of insertion order (checked by the script, too,
 * by comparing the built tree with the original, order included) */
static PyObject *
table_copy_ok(PyObject *self, PyObject *cap)
{
    Plan *p = PyCapsule_GetPointer(cap, "plan");
    if (p == NULL) {
        return NULL;
    }
    if (!LAYOUTS) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        Node *node = &p->nodes[i];
        if (node->kind != DICT) {
            continue;
        }
        PyDictObject *mp = (PyDictObject *)node->tmpl;
        Keys *k = (Keys *)mp->ma_keys;
        if (mp->ma_values != NULL || k->dk_nentries != node->arity || node->arity == 0) {
            Py_RETURN_FALSE;
        }
        for (Py_ssize_t j = 0; j < node->arity; j++) {
            if (!PyUnicode_CheckExact(node->keys[j * STEP])) {
                Py_RETURN_FALSE;
            }
        }
#if PY_VERSION_HEX >= 0x030B0000
        if (k->dk_kind != 1) {
            Py_RETURN_FALSE;
        }
#endif
    }
    Py_RETURN_TRUE;
}

/* the plan build0 and build1 follow, set by use() */
static PyObject *current;

static PyObject *
use(PyObject *self, PyObject *cap)
{
    if (PyCapsule_GetPointer(cap, "plan") == NULL) {
        return NULL;
    }
    Py_XSETREF(current, Py_NewRef(cap));
    Py_RETURN_NONE;
}

/* the tree of the current plan from leaves (a list), its dicts made the way
 * mode says. On 3.10 and 3.11 a collection could run inside any allocation
 * and walk what is made so far (the C engine defers tracking in a large tree
 * for that reason): the bound turns the collector off while it builds. */
static inline PyObject *
build(PyObject *list, int mode)
{
    Plan *p = current != NULL ? PyCapsule_GetPointer(current, "plan") : NULL;
    if (p == NULL || !PyList_CheckExact(list) || PyList_GET_SIZE(list) != p->leaves) {
        PyErr_SetString(PyExc_ValueError, "no plan, or not a list of its number of leaves");
        return NULL;
    }
    if (mode != 0 && !LAYOUTS) {
        PyErr_SetString(PyExc_RuntimeError, "build1 and build2 know the layouts of 3.10-3.13");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    int gc_was_on = PyGC_Disable();
#endif
    PyObject **leaves = ((PyListObject *)list)->ob_item;
    Py_ssize_t sp = 0;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        const Node *node = &p->nodes[i];
        Py_ssize_t a = node->arity;
        PyObject *o;
        switch (node->kind) {
        case LEAF:
            o = Py_NewRef(*leaves++);
            break;
        case LIST:
            o = PyList_New(a);
            if (o == NULL) {
                return NULL; /* (a bound: a failure leaks, and leaves the collector off) */
            }
            memcpy(((PyListObject *)o)->ob_item, &stack[sp - a], (size_t)a * sizeof(PyObject *));
            sp -= a;
            break;
        case TUPLE:
            o = PyTuple_New(a);
            if (o == NULL) {
                return NULL;
            }
            memcpy(((PyTupleObject *)o)->ob_item, &stack[sp - a], (size_t)a * sizeof(PyObject *));
            sp -= a;
            break;
        default: /* DICT */
            o = PyDict_New();
            if (o == NULL) {
                return NULL;
            }
            if (mode == 0) {
                for (Py_ssize_t j = 0; j < a; j++) {
                    PyObject *v = stack[sp - a + j];
                    if (PyDict_SetItem(o, node->keys[LAYOUTS ? j * STEP : j], v) < 0) {
                        return NULL;
                    }
                    Py_DECREF(v);
                }
            }
            else if (mode == 2) {
                PyDictObject *mp = (PyDictObject *)o;
                Keys *sk = node->shared;
                int track = 0;
                size_t cap = (size_t)(sk->dk_nentries + sk->dk_usable);
#if PY_VERSION_HEX >= 0x030B0000
#if PY_VERSION_HEX >= 0x030D0000
                /* capacity, size, embedded, valid; the values; the order after them */
                typedef struct {
                    uint8_t capacity, size, embedded, valid;
                    PyObject *values[1];
                } Values;
                Values *vs = PyMem_Malloc((cap + 1) * sizeof(PyObject *) + ((cap + 7) & ~(size_t)7));
                if (vs == NULL) {
                    return PyErr_NoMemory();
                }
                vs->embedded = 0;
                vs->capacity = (uint8_t)cap;
                vs->size = (uint8_t)a;
                PyObject **vals = vs->values;
                uint8_t *order = (uint8_t *)&vals[cap];
                for (Py_ssize_t j = 0; j < a; j++) {
                    order[j] = (uint8_t)j;
                }
                void *values = vs;
#else
                /* the order and its size before the values, then the prefix's size */
                size_t prefix = (cap + 2 + 7) & ~(size_t)7;
                uint8_t *mem = PyMem_Malloc(prefix + cap * sizeof(PyObject *));
                if (mem == NULL) {
                    return PyErr_NoMemory();
                }
                mem[prefix - 1] = (uint8_t)prefix;
                PyObject **vals = (PyObject **)(mem + prefix);
                uint8_t *size = (uint8_t *)vals - 2;
                *size = (uint8_t)a;
                for (Py_ssize_t j = 0; j < a; j++) {
                    size[-1 - j] = (uint8_t)j;
                }
                void *values = vals;
#endif
                for (size_t j = 0; j < cap; j++) {
                    PyObject *v = (Py_ssize_t)j < a ? stack[sp - a + (Py_ssize_t)j] : NULL;
                    vals[j] = v;
                    track |= v != NULL && PyObject_IS_GC(v);
                }
#if PY_VERSION_HEX < 0x030C0000
                ((Keys *)mp->ma_keys)->dk_refcnt--; /* the shared empty table's */
#endif
                sk->dk_refcnt++;
                mp->ma_keys = (void *)sk;
                mp->ma_values = values;
                mp->ma_used = a;
#else
                /* 3.10: the values alone, in the keys' order */
                PyObject **vals = PyMem_Malloc(cap * sizeof(PyObject *));
                if (vals == NULL) {
                    return PyErr_NoMemory();
                }
                for (size_t j = 0; j < cap; j++) {
                    PyObject *v = (Py_ssize_t)j < a ? stack[sp - a + (Py_ssize_t)j] : NULL;
                    vals[j] = v;
                    track |= v != NULL && PyObject_IS_GC(v);
                }
                ((Keys *)mp->ma_keys)->dk_refcnt--; /* the shared empty table's */
                sk->dk_refcnt++;
                mp->ma_keys = (void *)sk;
                mp->ma_values = vals;
                mp->ma_used = a;
#endif
                if (track && !PyObject_GC_IsTracked(o)) {
                    PyObject_GC_Track(o);
                }
            }
            else {
                PyDictObject *mp = (PyDictObject *)o;
#if PY_VERSION_HEX >= 0x030D0000
                Keys *k = PyMem_Malloc(node->size); /* (as CPython frees it from 3.13) */
#else
                Keys *k = PyObject_Malloc(node->size);
#endif
                if (k == NULL) {
                    return PyErr_NoMemory();
                }
                memcpy(k, ((PyDictObject *)node->tmpl)->ma_keys, node->size);
                k->dk_refcnt = 1;
#if PY_VERSION_HEX >= 0x030B0000
                k->dk_version = 0;
#endif
                PyObject **e = (PyObject **)(k->dk_indices + INDEX_BYTES(k)) + KEY0;
                int track = 0;
                for (Py_ssize_t j = 0; j < a; j++, e += STEP) {
                    PyObject *v = stack[sp - a + j];
                    Py_INCREF(e[0]);
                    e[1] = v; /* over the template's None, whose count it did not take */
                    track |= PyObject_IS_GC(v);
                }
#if PY_VERSION_HEX < 0x030C0000
                ((Keys *)mp->ma_keys)->dk_refcnt--; /* the shared empty table's */
#endif
                mp->ma_keys = (void *)k;
                mp->ma_values = NULL;
                mp->ma_used = a;
                if (track) {
                    PyObject_GC_Track(o);
                }
            }
            sp -= a;
            break;
        }
        stack[sp++] = o;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (gc_was_on) {
        PyGC_Enable();
    }
#endif
    return stack[0];
}

static PyObject *
build0(PyObject *self, PyObject *leaves)
{
    return build(leaves, 0);
}

static PyObject *
build1(PyObject *self, PyObject *leaves)
{
    return build(leaves, 1);
}

static PyObject *
build2(PyObject *self, PyObject *leaves)
{
    return build(leaves, 2);
}

static PyMethodDef methods[] = {
    {"compile", compile, METH_O, NULL},
    {"table_copy_ok", table_copy_ok, METH_O, NULL},
    {"use", use, METH_O, NULL},
    {"build0", build0, METH_O, NULL},
    {"build1", build1, METH_O, NULL},
    {"build2", build2, METH_O, NULL},
    {"split_ok", split_ok, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "unflatten_bound", NULL, -1, methods};
PyMODINIT_FUNC
PyInit_unflatten_bound(void)
{
    return PyModule_Create(&mod);
}
