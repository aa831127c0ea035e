/* leaves_bound: a lower bound for leaves(), the least any traversal can do.
 *
 * Used by benchmarks/leaves_bound.py only; not part of pytree_kit. It knows
 * exact dict, list and tuple and nothing else (every other object is a leaf),
 * reads dict values in insertion order (no key ordering at all), builds no
 * spec, checks no cycles, calls no is_leaf, and gathers the leaves in a static
 * C buffer before copying them into a list of exactly the right size. On
 * CPython 3.11 it reads a str-keyed dict's table directly (as the C engine
 * does). Nothing real can do less, so its time over the list-copy floor
 * bounds what any leaves() can reach. Not thread-safe, not reentrant. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAXSTACK 200000
#define MAXLEAVES 200000
static PyObject *stack[MAXSTACK], *leaf_buf[MAXLEAVES];

/* CPython 3.11's dict keys object (Include/internal/pycore_dict.h) */
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size, dk_log2_index_bytes, dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable, dk_nentries;
    char dk_indices[];
} Keys311;
#define ENTRIES311(k) ((PyObject **)((k)->dk_indices + ((size_t)1 << (k)->dk_log2_index_bytes)))
#define IS_311 (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

static PyObject *
leaves(PyObject *self, PyObject *tree)
{
    Py_ssize_t sp = 0, n = 0;
    stack[sp++] = tree;
    while (sp) {
        PyObject *o = stack[--sp];
        PyTypeObject *t = Py_TYPE(o);
        if (t == &PyList_Type || t == &PyTuple_Type) {
            Py_ssize_t k = Py_SIZE(o);
            PyObject **items = t == &PyList_Type ? ((PyListObject *)o)->ob_item
                                                 : ((PyTupleObject *)o)->ob_item;
            if (sp + k > MAXSTACK) return PyErr_NoMemory();
            for (Py_ssize_t i = k - 1; i >= 0; i--) stack[sp++] = items[i];
        } else if (t == &PyDict_Type) {
            Py_ssize_t k = PyDict_GET_SIZE(o), pos = 0, i = sp + k;
            PyObject *key, *value;
            if (sp + k > MAXSTACK) return PyErr_NoMemory();
            PyDictObject *mp = (PyDictObject *)o;
            Keys311 *kk = (Keys311 *)mp->ma_keys;
            if (IS_311 && mp->ma_values == NULL && kk->dk_nentries == k && k && kk->dk_kind == 1) {
                /* no holes, str keys: entries (key, value) in insertion order */
                PyObject **e = ENTRIES311(kk) + 1;
                for (Py_ssize_t j = 0; j < k; j++, e += 2) stack[--i] = *e;
            }
            else {
                while (PyDict_Next(o, &pos, &key, &value)) stack[--i] = value;
            }
            sp += k;
        } else {
            if (n == MAXLEAVES) return PyErr_NoMemory();
            leaf_buf[n++] = o;
        }
    }
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    PyObject **dst = ((PyListObject *)out)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) { Py_INCREF(leaf_buf[i]); dst[i] = leaf_buf[i]; }
    return out;
}

static PyMethodDef methods[] = {
    {"leaves", leaves, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "leaves_bound", NULL, -1, methods};
PyMODINIT_FUNC PyInit_leaves_bound(void) { return PyModule_Create(&mod); }
