/* pytree_kit._speedups: the C engine's module.
 *
 * The last of the engine's parts (_core.h has the map of what each does).
 * This file has the module's
 * functions table, its constants (FAST_PATHS, ...) and its init, which reads
 * what the engine needs from pytree_kit._pure, _messages, _spec, _keys and
 * _kinds (the Python functions it calls: _interface.C_BINDINGS), and
 * runs the fast paths' import-time checks (_fast_*.c).
 */
#include "_core.h"
#include "_for_torch.h"

/* _plans_made(): how many times the engine has worked out how to read a
 * class (for tests: a class met again, unchanged, is not read again) */
static PyObject *
sp_plans_made(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(PK_COUNT_READ(plans_made));
}

/* _plan_set(cls): the set of the class memo that cls's plan goes in, and
 * how many ways a set has (for tests) */
static PyObject *
sp_plan_set(PyObject *self, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "_plan_set() takes a class");
        return NULL;
    }
    MemoTable *t = &pk_state(self)->memo.plans;
    size_t set = (size_t)((char *)memo_set(t, (uintptr_t)cls) - t->entries) / (t->ways * t->size);
    return Py_BuildValue("(nn)", (Py_ssize_t)set, (Py_ssize_t)t->ways);
}

/* _memo_clear(): empties every table kept across calls (for tests, and for
 * a program that wants the memory back) */
static PyObject *
sp_memo_clear(PyObject *self, PyObject *unused)
{
    memo_clear(&pk_state(self)->memo);
    Py_RETURN_NONE;
}

/* _field_codes(cls, names, reads): the read codes of those fields of
 * instances of cls, read as reads says (_pure._field_read's answers: 0,
 * getattr; > 0, a slot's offset; < 0, a shared-keys index), for tests. */
static PyObject *
sp_field_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_field_codes(cls, names: tuple, reads: tuple)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    PyObject *reads = record_reads((PyTypeObject *)args[0], args[1], args[2], empty_tuple);
    if (reads == NULL && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *code = PyLong_FromSsize_t(reads ? reads_of(reads)->code[i] : 0);
        if (code == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, code);
    }
    Py_XDECREF(reads);
    return out;
}

static PyMethodDef methods[] = {
    {"flatten", (PyCFunction)(void (*)(void))sp_flatten, METH_FASTCALL,
     "flatten($module, tree, is_leaf=None, rules=None, /)\n--\n\n"
     "-> (leaves, spec)"},
    {"leaves", (PyCFunction)(void (*)(void))sp_leaves, METH_FASTCALL,
     "leaves($module, tree, is_leaf=None, rules=None, /)\n--\n\n"
     "-> leaves"},
    {"iter_leaves", (PyCFunction)(void (*)(void))sp_iter_leaves, METH_FASTCALL,
     "iter_leaves($module, tree, is_leaf=None, rules=None, /)\n--\n\n"
     "-> an iterator over the leaves"},
    {"flatten_one_level", (PyCFunction)(void (*)(void))sp_flatten_one_level, METH_FASTCALL,
     "flatten_one_level($module, tree, is_leaf=None, rules=None, /)\n--\n\n"
     "-> (children, spec), or None for a leaf"},
    {"any_leaf", (PyCFunction)(void (*)(void))sp_any_leaf, METH_FASTCALL,
     "any_leaf($module, tree, is_leaf, rules, want, /)\n--\n\n"
     "-> whether some leaf's truth is want"},
    {"flatten_with_path", (PyCFunction)(void (*)(void))sp_flatten_with_path, METH_FASTCALL,
     "flatten_with_path($module, tree, is_leaf=None, rules=None, is_leaf_takes_path=False, /)\n--\n\n"
     "-> ([(path, leaf), ...], spec)"},
    {"unflatten", (PyCFunction)(void (*)(void))sp_unflatten, METH_FASTCALL,
     "unflatten($module, spec, leaves, /)\n--\n\n"
     "-> tree"},
    {"flatten_up_to_columns", (PyCFunction)(void (*)(void))sp_flatten_up_to_columns, METH_FASTCALL,
     "flatten_up_to_columns($module, spec, trees, label='the spec', other='the tree', /)\n--\n\n"
     "-> columns"},
    {"flatten_up_to", (PyCFunction)(void (*)(void))sp_flatten_up_to, METH_FASTCALL,
     "flatten_up_to($module, spec, tree, label='the spec', other='the tree', /)\n--\n\n"
     "-> leaves"},
    {"keystr", (PyCFunction)pk_keystr, METH_O,
     "keystr($module, path, /)\n--\n\n"
     "-> ''.join(map(str, path))"},
    {"spec_compose", (PyCFunction)(void (*)(void))pk_spec_compose, METH_FASTCALL,
     "spec_compose($module, outer_nodes, outer_orders, inner_nodes, inner_orders, /)\n--\n\n"
     "-> (nodes, orders)"},
    {"spec_is_prefix", (PyCFunction)(void (*)(void))pk_spec_is_prefix, METH_FASTCALL,
     "spec_is_prefix($module, mine, theirs, /)\n--\n\n"
     "-> whether the nodes mine are a prefix of theirs"},
    {"spec_paths", (PyCFunction)(void (*)(void))pk_spec_paths, METH_FASTCALL,
     "spec_paths($module, nodes, /)\n--\n\n"
     "-> the path of each leaf"},
    {"path_get", (PyCFunction)(void (*)(void))pk_path_get, METH_FASTCALL,
     "path_get($module, tree, path, /)\n--\n\n"
     "-> (node, done): tree_get's reading of builtin containers"},
    /* the torch adapters' helpers (_for_torch.h) */
    PK_FOR_TORCH_METHODS,
    {"_field_codes", (PyCFunction)(void (*)(void))sp_field_codes, METH_FASTCALL,
     "_field_codes($module, cls, names, reads, /)\n--\n\n"
     "-> how each field is read (for tests)"},
    {"_plan_set", sp_plan_set, METH_O,
     "_plan_set($module, cls, /)\n--\n\n"
     "-> (the set of the class memo cls's plan goes in, ways per set) (for tests)"},
    {"_memo_clear", sp_memo_clear, METH_NOARGS,
     "_memo_clear($module)\n--\n\n"
     "-> None: empties every table kept across calls"},
    {"_plans_made", sp_plans_made, METH_NOARGS,
     "_plans_made($module)\n--\n\n"
     "-> how many times a class's plan was worked out (for tests)"},
    {NULL, NULL, 0, NULL},
};


static PyObject *
get_attr(PyObject *mod, const char *name)
{
    return PyObject_GetAttrString(mod, name);
}

static Py_ssize_t
slot_offset(PyObject *cls, const char *name)
{
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL) {
        return -1;
    }
    if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
        Py_DECREF(d);
        PyErr_Format(PyExc_ImportError, "%s.%s is not a slot", ((PyTypeObject *)cls)->tp_name,
                     name);
        return -1;
    }
    Py_ssize_t off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return off;
}

#define INTERN(var, text)                                     \
    do {                                                      \
        if ((var = PyUnicode_InternFromString(text)) == NULL) \
            goto fail;                                        \
    } while (0)

/* ------------------------------------------------------------------------ */
/* The module: multi-phase init, its state (PkState: what is kept across
 * calls) made per module object. The constants the parts read (_core.c) are
 * made once per process, by the first module's exec, and kept; the module is
 * refused in any other interpreter than that one (from 3.12 CPython refuses
 * it first: Py_mod_multiple_interpreters), where those constants' objects
 * are not its own. */

PK_INTERNAL PkState *
pk_state(PyObject *module)
{
    return (PkState *)PyModule_GetState(module);
}

/* the interpreter the constants were made in, once they are */
static PyInterpreterState *constants_made_in;

/* Makes the constants the parts read, and runs the fast paths' checks: 0, or
 * -1 with an error set. */
static int
constants_init(void)
{
    PyObject *pure = NULL, *messages = NULL, *spec = NULL, *keys = NULL, *kinds = NULL;
    int ok = -1;
    pure = PyImport_ImportModule("pytree_kit._pure");
    messages = PyImport_ImportModule("pytree_kit._messages");
    spec = PyImport_ImportModule("pytree_kit._spec");
    keys = PyImport_ImportModule("pytree_kit._keys");
    kinds = PyImport_ImportModule("pytree_kit._kinds");
    if (!pure || !messages || !spec || !keys || !kinds) {
        goto fail;
    }
    {
        PyObject *col = PyImport_ImportModule("collections");
        if (col == NULL) {
            goto fail;
        }
        OrderedDict_t = get_attr(col, "OrderedDict");
        defaultdict_t = get_attr(col, "defaultdict");
        deque_t = get_attr(col, "deque");
        Py_DECREF(col);
        if (!OrderedDict_t || !defaultdict_t || !deque_t) {
            goto fail;
        }
    }
    for (int k = 0; k < K_COUNT; k++) {
        if ((kind_obj[k] = PyLong_FromLong(k)) == NULL) {
            goto fail;
        }
    }
    if (!(LEAF_NODE = get_attr(kinds, "LEAF_NODE")) || !(NONE_NODE = get_attr(kinds, "NONE_NODE")) ||
        !(py_classify = get_attr(pure, "classify")) ||
        !(py_class_plan = get_attr(pure, "class_plan")) ||
        !(as_leaf_rule = get_attr(kinds, "AS_LEAF")) ||
        !(Carried_t = get_attr(kinds, "Carried")) ||
        !(nothing_carried = get_attr(kinds, "NOTHING_CARRIED")) ||
        !(py_refuse_leaves = get_attr(messages, "refuse_leaves")) ||
        !(py_refuse_trees = get_attr(messages, "refuse_trees")) ||
        !(py_dict_order_differs = get_attr(pure, "dict_order_differs")) ||
        !(py_dict_order = get_attr(pure, "dict_order")) ||
        !(py_custom_result = get_attr(pure, "_custom_result")) ||
        !(py_rule_result = get_attr(pure, "_rule_result")) ||
        !(py_cycle_error = get_attr(messages, "cycle_error")) || !(py_match = get_attr(pure, "_match")) ||
        !(py_mismatch = get_attr(pure, "_mismatch")) || !(py_build = get_attr(pure, "build")) ||
        !(SequenceKey_t = get_attr(keys, "SequenceKey")) || !(DictKey_t = get_attr(keys, "DictKey")) ||
        !(GetAttrKey_t = get_attr(keys, "GetAttrKey"))) {
        goto fail;
    }
    if (key_init() < 0 || pk_specops_init(spec) < 0 || pk_rows_init() < 0) {
        goto fail;
    }
    TreeSpec_type = (PyTypeObject *)get_attr(spec, "TreeSpec");
    if (TreeSpec_type == NULL) {
        goto fail;
    }
    if ((off_nodes = slot_offset((PyObject *)TreeSpec_type, "_nodes")) < 0 ||
        (off_orders = slot_offset((PyObject *)TreeSpec_type, "_orders")) < 0 ||
        (off_num_leaves = slot_offset((PyObject *)TreeSpec_type, "_num_leaves")) < 0 ||
        (off_hash = slot_offset((PyObject *)TreeSpec_type, "_hash")) < 0 ||
        (off_paths = slot_offset((PyObject *)TreeSpec_type, "_paths")) < 0 ||
        (off_recipe = slot_offset((PyObject *)TreeSpec_type, "_recipe")) < 0 ||
        (off_carried_order = slot_offset(Carried_t, "order")) < 0 ||
        (off_carried_state = slot_offset(Carried_t, "state")) < 0) {
        goto fail;
    }
    if (PyType_Ready(&StackView_Type) < 0 || PyType_Ready(&LeafIter_Type) < 0 ||
        PyType_Ready(&Recipe_Type) < 0) {
        goto fail;
    }
    if ((empty_tuple = PyTuple_New(0)) == NULL) {
        goto fail;
    }
    INTERN(s_tree_flatten, "__tree_flatten__");
    INTERN(s_thread_leaf, "pytree_kit.leaf_node");
    INTERN(s_tree_unflatten, "__tree_unflatten__");
    INTERN(s_new, "__new__");
    INTERN(s_len, "__len__");
    INTERN(s_flatten, "flatten");
    INTERN(s_the_spec, "the spec");
    INTERN(s_the_tree, "the tree");
    INTERN(s_dunder_dict, "__dict__");
    INTERN(s_data, "data");
    INTERN(s_dict, "dict");
    INTERN(s_userdict, "UserDict");
    tags_check();
#if DICT_READS
    dict_reads_check();
#endif
#if DICT_TABLES
    dict_layout_check(); /* after dict_reads_check: it needs the reads */
#endif
#if SPLIT_READS
    split_reads_check();
#endif
#if ODICT_LINKS
    odict_links_check();
#endif
    ok = 0;
fail:
    Py_XDECREF(pure);
    Py_XDECREF(messages);
    Py_XDECREF(spec);
    Py_XDECREF(keys);
    Py_XDECREF(kinds);
    return ok;
}

/* The module's attributes that say what this build does (FAST_PATHS, ...). */
static int
add_build_facts(PyObject *m)
{
    PyObject *fast = Py_BuildValue(
        "{sNsNsNsNsN}", "type_version_tags", PyBool_FromLong(VERSION_TAGS && plans_kept()),
        "dict_reads", PyBool_FromLong(DICT_READS && dict_reads_ok), "dict_tables",
        PyBool_FromLong(DICT_TABLES && dict_layout_ok), "split_values",
        PyBool_FromLong(SPLIT_READS && split_reads_ok), "odict_links",
        PyBool_FromLong(ODICT_LINKS && odict_links_ok));
    int added = fast == NULL ? -1 : PyModule_AddObjectRef(m, "FAST_PATHS", fast);
    Py_XDECREF(fast);
#ifdef PK_NO_FAST_PATHS
    const int no_fast_paths = 1;
#else
    const int no_fast_paths = 0;
#endif
    if (added < 0 ||
        PyModule_AddIntConstant(m, "DICT_TABLES", DICT_TABLES && dict_layout_ok) < 0 ||
        PyModule_AddIntConstant(m, "VALIDATED_PYTHON", PK_VALIDATED_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "NO_FAST_PATHS", no_fast_paths) < 0 ||
        PyModule_AddIntConstant(m, "KEEP_ACROSS_CALLS", KEEP_ACROSS_CALLS) < 0 ||
        PyModule_AddIntConstant(m, "PLANS_KEPT", plans_kept()) < 0) {
        return -1;
    }
    return 0;
}

static int
module_exec(PyObject *m)
{
    PkState *st = pk_state(m);
    PyInterpreterState *here = PyInterpreterState_Get();
    if (constants_made_in != NULL && constants_made_in != here) {
        PyErr_SetString(PyExc_ImportError,
                        "pytree_kit._speedups: one interpreter of a process can use it");
        return -1;
    }
    memset(st, 0, sizeof(*st));
    if (memo_init(&st->memo) < 0) {
        return -1;
    }
    if (constants_made_in == NULL) {
        if (constants_init() < 0) {
            return -1;
        }
        constants_made_in = here;
    }
    if (PyModule_AddStringConstant(m, "NAME", "c") < 0 || add_build_facts(m) < 0) {
        return -1;
    }
    /* tree_get is the specification's own (_pure.tree_get): it reads builtin
     * containers with this engine's path_get, and every other node as this
     * engine's flatten_one_level finds its children. */
    PyObject *pure = PyImport_ImportModule("pytree_kit._pure");
    PyObject *tree_get = pure == NULL ? NULL : get_attr(pure, "tree_get");
    int added = tree_get == NULL ? -1 : PyModule_AddObjectRef(m, "tree_get", tree_get);
    Py_XDECREF(tree_get);
    Py_XDECREF(pure);
    if (added < 0) {
        return -1;
    }
    return pk_fastcall_add(m);
}

/* Lets go of what the state keeps (the module going, or its clear). */
static void
state_clear(PkState *st)
{
    memo_free(&st->memo);
    for (int k = 0; k < 2; k++) {
        for (int n = 0; n < SHARED_SEQ_NODES; n++) {
            Py_CLEAR(st->seq_nodes[k][n]);
        }
    }
    for (int n = 0; n <= SPARE_MAX; n++) {
        while (st->spare_n[n] > 0) {
            PyObject *t = st->spare[n][--st->spare_n[n]];
            Py_DECREF(t); /* an emptied tuple: its items are NULL */
        }
    }
}

/* No entry of the state holds an object that could reach the module again
 * (strs, ints, None, bytes, and tuples and dicts of those; a class plan
 * holds no class): the collector need not see them, and no traverse is
 * given. */
static void
module_free(void *module)
{
    PkState *st = pk_state((PyObject *)module);
    if (st != NULL) {
        state_clear(st);
    }
    pk_fastcall_module_gone((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_GIL_DISABLED
    /* safe with the GIL off: READ_SNAPSHOTS and KEEP_ACROSS_CALLS (_core.h) */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pytree_kit._speedups",
    .m_doc = "The C engine of pytree_kit: the same results as pytree_kit._pure, faster.",
    .m_size = sizeof(PkState),
    .m_methods = methods,
    .m_slots = module_slots,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&moduledef);
}
