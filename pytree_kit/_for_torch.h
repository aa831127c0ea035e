/* pytree_kit._speedups: the torch adapters' helpers, an interface of their
 * own. The core engine (flatten, unflatten, ...; _core.h) neither calls nor
 * needs them; the module lists them in a section of its functions table
 * (PK_FOR_TORCH_METHODS) and makes what they keep on import (pk_rows_init).
 * Each has a Python specification of the same name, which the pure engine
 * serves:
 *   _reach.c  first_reaching: the search behind pytree_kit.torch's check for
 *             tensors hidden in leaves (pytree_kit/_reach.py)
 *   _rows.c   packed_sample, number_list, leaf_codes: PackedList's rows
 *             (pytree_kit/_rows.py)
 */
#ifndef PYTREE_KIT_FOR_TORCH_H
#define PYTREE_KIT_FOR_TORCH_H

#include "_speedups.h"

/* first_reaching(leaves, start, target, skip, opaque, registered, limit) */
PK_INTERNAL PyObject *pk_first_reaching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* packed_sample(bufs, specs, i, make) */
PK_INTERNAL PyObject *pk_packed_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* number_list(x) and leaf_codes(leaves), for packing */
PK_INTERNAL PyObject *pk_number_list(PyObject *self, PyObject *x);
PK_INTERNAL PyObject *pk_leaf_codes(PyObject *self, PyObject *leaves);
/* makes what _rows.c keeps; -1 with an error set */
PK_INTERNAL int pk_rows_init(void);

/* The helpers' entries in the module's functions table. */
#define PK_FOR_TORCH_METHODS                                                                     \
    {"first_reaching", (PyCFunction)(void (*)(void))pk_first_reaching, METH_FASTCALL,           \
     "first_reaching($module, leaves, start, target, skip, opaque, registered, limit, /)\n--\n\n" \
     "-> index or -1"},                                                                          \
        {"packed_sample", (PyCFunction)(void (*)(void))pk_packed_sample, METH_FASTCALL,          \
         "packed_sample($module, bufs, specs, i, make, /)\n--\n\n"                              \
         "-> sample i of a packed dataset"},                                                     \
        {"number_list", (PyCFunction)pk_number_list, METH_O,                                     \
         "number_list($module, x, /)\n--\n\n"                                                    \
         "-> whether x is a non-empty list of exact ints or of exact floats"},                   \
        {"leaf_codes", (PyCFunction)pk_leaf_codes, METH_O,                                       \
         "leaf_codes($module, leaves, /)\n--\n\n"                                                \
         "-> each leaf's packing code, or None"}

#endif
