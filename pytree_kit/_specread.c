/* _specread.c: reading a TreeSpec.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   spec_parts     a spec's nodes, orders and leaf count, from its slots
 *   node_parts     a node's kind and arity, checked (pk_node_parts for the
 *                  other files)
 *   order_index    the node index of an insertion-order entry
 * Calls: only the C API. Called by _unflatten.c, _up_to.c, _specops.c, _flatten.c.
 */

#include "_core.h"

/* The value of an exact int known to be small and non-negative, read
 * without a call where the public API allows (3.12 on); -1 (maybe with an
 * error set) otherwise. (On 3.10 and 3.11 the int_digits fast path read the
 * digit itself: at most 8 % on a family, state_dict 10's unflatten, under the
 * 10 % a fast path must buy: benchmarks/results/python3.11/fast_paths.md.) */
PK_SHARED_INLINE Py_ssize_t
small_long(PyObject *o)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#endif
    return PyLong_AsSsize_t(o);
}

PK_SHARED int
spec_parts(PyObject *spec, PyObject **nodes, PyObject **orders, Py_ssize_t *num_leaves)
{
    if (!PyObject_TypeCheck(spec, TreeSpec_type)) {
        PyErr_Format(PyExc_TypeError, "expected a TreeSpec, got %.200s", Py_TYPE(spec)->tp_name);
        return -1;
    }
    *nodes = SLOT(spec, off_nodes);
    *orders = SLOT(spec, off_orders);
    PyObject *n = SLOT(spec, off_num_leaves);
    if (*nodes == NULL || !PyTuple_Check(*nodes) || *orders == NULL || !PyTuple_Check(*orders) ||
        n == NULL || !PyLong_Check(n)) {
        PyErr_SetString(PyExc_ValueError, "malformed TreeSpec");
        return -1;
    }
    *num_leaves = PyLong_AsSsize_t(n);
    if (*num_leaves == -1 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

/* kind and arity of a node, checked; -1 on a malformed node */
static int
node_parts_slow(PyObject *node, int *kind, Py_ssize_t *arity)
{
    if (!PyTuple_CheckExact(node) || PyTuple_GET_SIZE(node) != 4) {
        goto bad;
    }
    long k = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    if (k < 0 || k >= K_COUNT) {
        PyErr_Clear();
        goto bad;
    }
    *kind = (int)k;
    *arity = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 2));
    if (*arity < 0 || (k == K_LEAF && *arity != 0)) {
        PyErr_Clear();
        goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: a node is not (kind, type, arity, aux)");
    return -1;
}

PK_SHARED_INLINE int
node_parts(PyObject *node, int *kind, Py_ssize_t *arity)
{
    if (IS_LEAF_NODE(node)) {
        *kind = K_LEAF;
        *arity = 0;
        return 0;
    }
    if (PyTuple_CheckExact(node) && PyTuple_GET_SIZE(node) == 4) {
        /* small ints are shared objects: the common kinds compare by identity */
        PyObject *ko = PyTuple_GET_ITEM(node, 0);
        PyObject *ao = PyTuple_GET_ITEM(node, 2);
        int k = ko == kind_obj[K_DICT] ? K_DICT : ko == kind_obj[K_LIST] ? K_LIST
              : ko == kind_obj[K_TUPLE] ? K_TUPLE : -1;
        if (k < 0) {
            /* the other kinds but the leaf's (whose arity must be 0) */
            for (int j = K_LEAF + 1; j < K_COUNT; j++) {
                if (ko == kind_obj[j]) {
                    k = j;
                    break;
                }
            }
        }
        if (k >= 0 && PyLong_CheckExact(ao)) {
            Py_ssize_t a = small_long(ao);
            if (a >= 0) {
                *kind = k;
                *arity = a;
                return 0;
            }
            PyErr_Clear();
        }
    }
    return node_parts_slow(node, kind, arity);
}

int
pk_node_parts(PyObject *node, int *kind, Py_ssize_t *arity)
{
    return node_parts(node, kind, arity);
}


/* The node index of orders[i], a pair checked to start with an exact int
 * that fits. Not inlined: the unflatten loop is short of registers. */
PK_NO_INLINE PK_SHARED Py_ssize_t
order_index(PyObject *orders, Py_ssize_t i)
{
    return small_long(PyTuple_GET_ITEM(PyTuple_GET_ITEM(orders, i), 0));
}
