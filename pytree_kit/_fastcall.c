/* FastCall: the public API's common calls without Python in between.
 *
 * pytree_kit.api's functions are Python defs. Their keyword-only arguments
 * and the check of rules= cost about 0.1 µs a call, as much as flattening a
 * dict of 10 leaves takes the engine. When the C engine is active, each def
 * marked @c_fast_call(op) in api.py (_engine.c_fast_call) is wrapped in a
 * FastCall, which takes the common shapes of call itself, calling the
 * engine's entry points directly:
 *   - the required arguments given by position,
 *   - is_leaf= (by position too, for the jax-style aliases),
 *   - rules=None.
 * Which of these a def takes is read from its signature, in Python
 * (_engine.call_shape), and given to the constructor: the defs are the one
 * place the signatures are written. This file knows the operations, and how
 * many positional arguments each reads; a def that requires another number
 * is refused.
 * Every other call (rules given, *rest trees, a wrong number of arguments, an
 * unknown keyword, a spec that is not exactly a TreeSpec) goes to the def
 * unchanged, so the def stays the one definition of the function: its
 * checks, its errors, its docstring and its signature (functools.wraps sets
 * __wrapped__, __doc__, __name__, ... in the FastCall's __dict__). Where a
 * FastCall takes a call itself, it does exactly what the def does with it.
 *
 * A FastCall binds like a function when read from a class (it is a method
 * descriptor), pickles by its qualified name, can be weakly referenced, and
 * takes part in cyclic GC. */

#include "_speedups.h"

#include <stddef.h>
#include <string.h>

enum { OP_FLATTEN, OP_LEAVES, OP_WITH_PATH, OP_STRUCTURE, OP_UNFLATTEN, OP_TREE_MAP };

/* The operations, by the name _engine.c_fast_call gives, with the number of
 * positional arguments each reads (its operands). */
static const struct {
    const char *name;
    int op;
    int operands;
} ops[] = {
    {"flatten", OP_FLATTEN, 1},
    {"leaves", OP_LEAVES, 1},
    {"flatten_with_path", OP_WITH_PATH, 1},
    {"structure", OP_STRUCTURE, 1},
    {"unflatten", OP_UNFLATTEN, 2},
    {"tree_map", OP_TREE_MAP, 2},
};

/* The calls a FastCall takes itself, from its def's signature. */
typedef struct {
    int op;
    int npos;        /* required positional arguments: the operation's operands */
    int has_is_leaf; /* takes is_leaf= */
    int is_leaf_at;  /* is_leaf's position when it may be given by position, else -1 */
    int has_rules;   /* takes rules= */
} Shape;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *func;      /* the def */
    PyObject *spec_type; /* TreeSpec */
    PyObject *dict;      /* __dict__ */
    PyObject *weakrefs;
    PyObject *module;    /* strong: the engine's module, whose state the calls read */
    PkState *st;         /* its state */
    Shape shape;
} FastCall;

static PyObject *s_is_leaf, *s_rules;
/* the module FastCalls made now take (borrowed: the module's init sets it,
 * its going clears it) */
static PyObject *current_module;

static int
name_is(PyObject *name, PyObject *want)
{
    return name == want || PyUnicode_Compare(name, want) == 0;
}

/* fn applied to each leaf of tree, as [fn(x) for x in leaves], and unflattened */
static PyObject *
tree_map1(PkState *st, PyObject *fn, PyObject *tree, PyObject *is_leaf)
{
    PyObject *flat = pk_walk(st, tree, is_leaf, Py_None, WALK_SPEC);
    if (flat == NULL) {
        return NULL;
    }
    PyObject *leaves = PyTuple_GET_ITEM(flat, 0), *spec = PyTuple_GET_ITEM(flat, 1);
    Py_ssize_t n = PyList_GET_SIZE(leaves);
    PyObject *mapped = PyList_New(n), *result = NULL;
    if (mapped == NULL) {
        goto done;
    }
    /* not visible to gc.get_objects() while it has empty slots */
    PyObject_GC_UnTrack(mapped);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the list is ours alone: fn cannot change it */
        PyObject *v = PyObject_CallOneArg(fn, PyList_GET_ITEM(leaves, i));
        if (v == NULL) {
            goto done;
        }
        PyList_SET_ITEM(mapped, i, v);
    }
    PyObject_GC_Track(mapped);
    result = pk_unflatten(st, spec, mapped);
done:
    Py_XDECREF(mapped);
    Py_DECREF(flat);
    return result;
}

static PyObject *
fastcall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastCall *fc = (FastCall *)self;
    const Shape *sh = &fc->shape;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *is_leaf = NULL;
    if (nargs == sh->npos + 1 && sh->is_leaf_at == sh->npos) {
        is_leaf = args[sh->npos];
    }
    else if (nargs != sh->npos) {
        goto slow;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (is_leaf == NULL && sh->has_is_leaf && name_is(name, s_is_leaf)) {
            is_leaf = value;
        }
        else if (!(sh->has_rules && value == Py_None && name_is(name, s_rules))) {
            goto slow;
        }
    }
    if (is_leaf == NULL) {
        is_leaf = Py_None;
    }
    switch (sh->op) {
    case OP_FLATTEN:
        return pk_walk(fc->st, args[0], is_leaf, Py_None, WALK_SPEC);
    case OP_LEAVES:
        return pk_walk(fc->st, args[0], is_leaf, Py_None, WALK_LEAVES);
    case OP_WITH_PATH:
        return pk_walk(fc->st, args[0], is_leaf, Py_None, WALK_PATHS);
    case OP_STRUCTURE: {
        PyObject *flat = pk_walk(fc->st, args[0], is_leaf, Py_None, WALK_SPEC);
        if (flat == NULL) {
            return NULL;
        }
        PyObject *spec = Py_NewRef(PyTuple_GET_ITEM(flat, 1));
        Py_DECREF(flat);
        return spec;
    }
    case OP_UNFLATTEN:
        if ((PyObject *)Py_TYPE(args[0]) != fc->spec_type) {
            goto slow;
        }
        return pk_unflatten(fc->st, args[0], args[1]);
    case OP_TREE_MAP:
        return tree_map1(fc->st, args[0], args[1], is_leaf);
    }
slow:
    if (fc->func == NULL) { /* cleared by the GC, breaking a cycle */
        PyErr_SetString(PyExc_ReferenceError, "this FastCall was cleared by the garbage collector");
        return NULL;
    }
    return PyObject_Vectorcall(fc->func, args, nargsf, kwnames);
}

static PyObject *
fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *func, *spec_type;
    const char *name;
    Shape sh = {0};
    static char *kwlist[] = {"func", "op", "spec_type", "npos", "is_leaf", "is_leaf_at", "rules",
                             NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsO!ipip:FastCall", kwlist, &func, &name,
                                     &PyType_Type, &spec_type, &sh.npos, &sh.has_is_leaf,
                                     &sh.is_leaf_at, &sh.has_rules)) {
        return NULL;
    }
    if (!PyCallable_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: func must be callable");
        return NULL;
    }
    size_t k = 0, n_ops = sizeof(ops) / sizeof(ops[0]);
    while (k < n_ops && strcmp(ops[k].name, name) != 0) {
        k++;
    }
    if (k == n_ops) {
        PyErr_Format(PyExc_ValueError, "FastCall: no fast call for %s", name);
        return NULL;
    }
    /* the operation reads args[0 .. operands - 1] of a call of npos arguments */
    if (sh.npos != ops[k].operands) {
        PyErr_Format(PyExc_ValueError,
                     "FastCall: %R requires %d positional arguments, but %s takes %d", func,
                     sh.npos, name, ops[k].operands);
        return NULL;
    }
    if (sh.is_leaf_at < -1) {
        PyErr_Format(PyExc_ValueError, "FastCall: is_leaf_at must be -1 or a position, not %d",
                     sh.is_leaf_at);
        return NULL;
    }
    sh.op = ops[k].op;
    if (current_module == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FastCall: the engine's module is gone");
        return NULL;
    }
    FastCall *fc = (FastCall *)type->tp_alloc(type, 0);
    if (fc == NULL) {
        return NULL;
    }
    fc->module = Py_NewRef(current_module);
    fc->st = pk_state(current_module);
    fc->vectorcall = fastcall_vectorcall;
    fc->func = Py_NewRef(func);
    fc->spec_type = Py_NewRef(spec_type);
    fc->dict = NULL;
    fc->weakrefs = NULL;
    fc->shape = sh;
    return (PyObject *)fc;
}

static int
fastcall_traverse(FastCall *fc, visitproc visit, void *arg)
{
    Py_VISIT(fc->func);
    Py_VISIT(fc->spec_type);
    Py_VISIT(fc->dict);
    Py_VISIT(fc->module);
    return 0;
}

static int
fastcall_clear(FastCall *fc)
{
    Py_CLEAR(fc->func);
    Py_CLEAR(fc->spec_type);
    Py_CLEAR(fc->dict);
    return 0;
}

static void
fastcall_dealloc(FastCall *fc)
{
    PyObject_GC_UnTrack(fc);
    if (fc->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)fc);
    }
    fastcall_clear(fc);
    /* the module last, not in tp_clear: a call may still come while the GC
     * breaks a cycle, and its state must be there (the def is gone then, and
     * the call says so) */
    Py_CLEAR(fc->module);
    Py_TYPE(fc)->tp_free((PyObject *)fc);
}

/* Binds like a function: read from an instance, a bound method. */
static PyObject *
fastcall_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
fastcall_repr(FastCall *fc)
{
    return PyUnicode_FromFormat("<fast call of %R>", fc->func);
}

/* Pickled (and copied) by qualified name, like a function. */
static PyObject *
fastcall_reduce(PyObject *self, PyObject *unused)
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef fastcall_methods[] = {
    {"__reduce__", fastcall_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

#if PY_VERSION_HEX >= 0x030E0000
/* From 3.14 functools.update_wrapper copies a def's __annotate__, not its
 * __annotations__ (PEP 649), which a function works out from __annotate__
 * when asked: a FastCall gives its def's, unless some were set on it (as
 * update_wrapper sets them up to 3.13, into its __dict__). */
static PyObject *s_annotations;

static PyObject *
fastcall_get_annotations(PyObject *self, void *unused)
{
    FastCall *fc = (FastCall *)self;
    if (fc->dict != NULL) {
        /* a new reference (3.13's PyDict_GetItemRef): on a free-threaded
         * build another thread may set or delete the item meanwhile */
        PyObject *v;
        int found = PyDict_GetItemRef(fc->dict, s_annotations, &v);
        if (found != 0) {
            return found > 0 ? v : NULL;
        }
    }
    return PyObject_GetAttr(fc->func, s_annotations);
}

static int
fastcall_set_annotations(PyObject *self, PyObject *value, void *unused)
{
    PyObject *dict = PyObject_GenericGetDict(self, NULL);
    if (dict == NULL) {
        return -1;
    }
    int r = value != NULL ? PyDict_SetItem(dict, s_annotations, value)
                          : PyDict_DelItem(dict, s_annotations);
    Py_DECREF(dict);
    if (r < 0 && value == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) {
        PyErr_SetObject(PyExc_AttributeError, s_annotations);
    }
    return r;
}
#endif

static PyGetSetDef fastcall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
#if PY_VERSION_HEX >= 0x030E0000
    {"__annotations__", fastcall_get_annotations, fastcall_set_annotations, NULL, NULL},
#endif
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pytree_kit._speedups.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "FastCall(func, op, spec_type, npos, is_leaf, is_leaf_at, rules): func, with its\n"
              "common calls made in C (the shape of call from _engine.call_shape(func)).",
    .tp_new = fastcall_new,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = fastcall_get,
    .tp_repr = (reprfunc)fastcall_repr,
    .tp_methods = fastcall_methods,
    .tp_getset = fastcall_getset,
    .tp_dictoffset = offsetof(FastCall, dict),
    .tp_weaklistoffset = offsetof(FastCall, weakrefs),
};

/* The module going: FastCalls made from now on have none to take. */
void
pk_fastcall_module_gone(PyObject *module)
{
    if (current_module == module) {
        current_module = NULL;
    }
}

int
pk_fastcall_add(PyObject *module)
{
    current_module = module;
    if ((s_is_leaf = PyUnicode_InternFromString("is_leaf")) == NULL ||
        (s_rules = PyUnicode_InternFromString("rules")) == NULL) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030E0000
    if ((s_annotations = PyUnicode_InternFromString("__annotations__")) == NULL) {
        return -1;
    }
#endif
    if (PyType_Ready(&FastCall_Type) < 0) {
        return -1;
    }
    Py_INCREF(&FastCall_Type);
    if (PyModule_AddObject(module, "FastCall", (PyObject *)&FastCall_Type) < 0) {
        Py_DECREF(&FastCall_Type);
        return -1;
    }
    return 0;
}
