/* pytree_kit._speedups: the C engine.
 *
 * It implements the engine interface of pytree_kit/_pure.py (flatten, leaves,
 * flatten_with_path, unflatten, flatten_up_to) and must give exactly what the
 * pure engine gives: the same leaves, the same spec nodes and the same errors.
 *
 * How it stays exact:
 *  - The common kinds (tuple, list, dict, None, namedtuple, dataclass, attrs,
 *    __tree_flatten__ and rules) are handled here, in the same order of checks
 *    and with the same calls into user code as _pure.classify.
 *  - Everything rare (OrderedDict, defaultdict, deque, structseq, metaclasses
 *    with their own attribute lookup, static fields, ...) is handed to the
 *    pure engine's own functions, with the traversal stack rebuilt in the pure
 *    engine's format so that paths in messages come out the same.
 *  - Every error message is made by the pure engine's functions.
 *
 * Traversals use explicit stacks on the heap: no C recursion on user data.
 * Its Python types are StackView (below) and FastCall (_fastcall.c, the public
 * API's common calls made directly). Between calls it keeps only
 * constants and what it learnt about classes (see SavedPlan), checked against
 * CPython's type version tags so that it is never stale.
 */

#include "_speedups.h"
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Fast paths that read CPython's own layouts
 *
 * Each is compiled only for the CPython versions on which it was validated
 * (PK_VALIDATED_PYTHON below: 3.10 to 3.13, with the GIL), and checked again when the
 * module is imported; a check that fails leaves its path off, and the engine
 * reads through the public API instead, more slowly, with the same results.
 * Building with PYTREE_KIT_NO_FAST_PATHS=1 (which defines PK_NO_FAST_PATHS)
 * leaves every one out, so that the suite can show the fallbacks are right.
 * They are listed, on or off, in FAST_PATHS (pytree_kit.engine_info()):
 *   type_version_tags  a class's plan is remembered while its tp_version_tag
 *                      holds (3.10-3.13; VERSION_TAGS, version_tags_check)
 *   int_digits         a one-digit int's value read from ob_digit (3.10, 3.11;
 *                      3.12 on has PyUnstable_Long_CompactValue; INT_DIGITS,
 *                      int_digits_check)
 *   instance_values    a record's fields read from its inline values (3.11;
 *                      LAYOUT_311, values_reads_check)
 *   dict_tables        a dict's table read and copied directly (3.11;
 *                      LAYOUT_311, dict_layout_check) */
#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000
#define PK_VALIDATED_PYTHON 1
#else
#define PK_VALIDATED_PYTHON 0
#endif
#ifdef PK_NO_FAST_PATHS
#define PK_VALIDATED 0
#else
#define PK_VALIDATED PK_VALIDATED_PYTHON
#endif
#define VERSION_TAGS PK_VALIDATED
#define INT_DIGITS (PK_VALIDATED && PY_VERSION_HEX < 0x030C0000)

/* ------------------------------------------------------------------------ */
/* Kinds: in _speedups.h, in step with _kinds.py */

/* How the children of a frame are named in paths (as in _pure). */
enum { KM_SEQ = 0, KM_MAP = 1, KM_ATTR = 2 };

/* ------------------------------------------------------------------------ */
/* Module constants, set once by the module's init. */

static PyObject *kind_obj[K_COUNT];
static PyObject *LEAF_NODE, *NONE_NODE;
static PyTypeObject *TreeSpec_type;
static Py_ssize_t off_nodes, off_orders, off_num_leaves, off_hash;
static PyObject *py_customised; /* _pure._customised: a record class's attribute hook */
static PyObject *py_classify, *py_dict_order_differs, *py_custom_result,
    *py_rule_result, *py_cycle_error, *py_match, *py_mismatch, *py_build;
static PyObject *SequenceKey_t, *DictKey_t, *GetAttrKey_t;
static PyObject *FIELD_marker;
static PyObject *OrderedDict_t, *defaultdict_t, *deque_t;
static PyObject *s_tree_flatten, *s_tree_unflatten, *s_fields, *s_n_sequence_fields,
    *s_n_fields, *s_dataclass_fields, *s_attrs_attrs, *s_field_type, *s_name, *s_metadata,
    *s_get, *s_static, *s_new, *s_flatten, *s_len, *s_the_spec, *s_the_tree, *s_getattribute;
static PyObject *empty_tuple;
static PyObject *object_new_fn;          /* object.__dict__['__new__'] */
static PyObject *object_getattribute_fn; /* object.__dict__['__getattribute__'] */

/* ------------------------------------------------------------------------ */
/* Small helpers */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int
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

static PyObject *
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

static PyObject *
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
    Py_INCREF(Py_None);
    SLOT(spec, off_hash) = Py_None;
    return spec;
}

/* getattr(t, name, <absent>) for a class, when that runs no Python code.
 * Returns 0 with *out a new reference (or NULL when absent), -1 on error, and
 * 1 when the lookup could run Python code (a metaclass with its own lookup or
 * the name, or a descriptor written in Python): the caller then leaves the
 * whole decision to the pure engine. */
static int
type_attr(PyTypeObject *t, PyObject *name, PyObject **out)
{
    PyTypeObject *meta = Py_TYPE(t);
    *out = NULL;
    if (meta != &PyType_Type) {
        if (meta->tp_getattro != PyType_Type.tp_getattro) {
            return 1;
        }
        if (_PyType_Lookup(meta, name) != NULL) {
            return 1;
        }
    }
    PyObject *raw = _PyType_Lookup(t, name);
    if (raw == NULL) {
        return 0;
    }
    descrgetfunc get = Py_TYPE(raw)->tp_descr_get;
    if (get == NULL) {
        Py_INCREF(raw);
        *out = raw;
        return 0;
    }
    if (PyType_HasFeature(Py_TYPE(raw), Py_TPFLAGS_HEAPTYPE)) {
        return 1;
    }
    Py_INCREF(raw);
    PyObject *v = get(raw, NULL, (PyObject *)t);
    Py_DECREF(raw);
    if (v == NULL) {
        PyErr_Clear();
        return 1;
    }
    *out = v;
    return 0;
}

/* set on import by version_tags_check, where compiled */
static int version_tags_ok;

/* A class's version tag, or 0 when it has no valid one (or the tags are not
 * used here: then every plan is decided again when it is needed). Up to 3.12
 * CPython marks a valid tag with Py_TPFLAGS_VALID_VERSION_TAG; 3.13 no longer
 * sets that flag, and a tag is valid when it is not 0 (PyType_Modified sets it
 * to 0 on every version). */
static inline unsigned int
type_version(PyTypeObject *t)
{
#if VERSION_TAGS
#if PY_VERSION_HEX < 0x030D0000
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0;
    }
#endif
    return version_tags_ok ? t->tp_version_tag : 0;
#else
    (void)t;
    return 0;
#endif
}

/* ------------------------------------------------------------------------ */
/* Reading a record's fields without PyObject_GetAttr
 *
 * For an instance of a class with CPython's generic attribute lookup,
 * getattr(obj, name) is decided by what the class (with its bases) binds the
 * name to:
 *  - a slot (a member descriptor of T_OBJECT_EX): the pointer at the slot's
 *    offset in the instance;
 *  - nothing, or a non-data descriptor whose type is immutable (a default
 *    value such as 0 or None, a function): the instance's own value when it
 *    has one. On CPython 3.11 that value sits in the instance's inline values
 *    array, at the name's index in the class's shared keys.
 * A class's reads are worked out with its plan, so they follow the class's
 * version tag like the plan does: one code per field, 0 for PyObject_GetAttr,
 * > 0 for a slot's offset, < 0 for -1 - the index in the shared keys. A read
 * that finds nothing (an unset slot, no value, values moved to a dict) goes to
 * PyObject_GetAttr, which gives the class's default, the AttributeError or
 * whatever else CPython would. The fast reads run no user code. */

/* set on import by values_reads_check and dict_layout_check, where compiled */
static int values_reads_ok, dict_layout_ok;

#if PK_VALIDATED && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define LAYOUT_311 1
/* CPython 3.11's layout (Include/internal/pycore_object.h and pycore_dict.h):
 * an instance of a class with Py_TPFLAGS_MANAGED_DICT has, 4 pointers before
 * the object, a pointer to its values array (NULL once a dict is made for it),
 * and the class's shared keys are this struct, with dk_nentries entries of
 * (key, value) after 1 << dk_log2_index_bytes bytes of indices; a dict's
 * table (ma_keys) is the same struct, its entries (hash, key, value) when its
 * keys are not all str. The module checks these on import (values_reads_check,
 * dict_layout_check) and leaves the paths that rely on them off if a check
 * fails. */
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} Keys311;

typedef struct {
    PyObject *me_key, *me_value;
} UnicodeEntry311; /* entries of str-keyed tables */
typedef struct {
    Py_hash_t me_hash;
    PyObject *me_key, *me_value;
} Entry311; /* entries of other tables */
#define ENTRIES311(k) ((void *)((k)->dk_indices + ((size_t)1 << (k)->dk_log2_index_bytes)))

#define VALUES_OF(obj) (((PyObject ***)(obj))[-4])
#define SHARED_KEYS(t) ((Keys311 *)((PyHeapTypeObject *)(t))->ht_cached_keys)

/* An exact dict's table read directly, when it has no holes (every entry in
 * use, so entry i is the i-th item): 1 with *first pointing at the first
 * entry's key and *step the pointers from one entry to the next, the value
 * right after its key; 0 when PyDict_Next must read it. */
static inline int
dict_table(PyObject *d, PyObject ***first, Py_ssize_t *step)
{
    PyDictObject *mp = (PyDictObject *)d;
    Keys311 *k = (Keys311 *)mp->ma_keys;
    /* (an empty dict's shared empty table has no aligned entries to point at) */
    if (!dict_layout_ok || mp->ma_values != NULL || k->dk_nentries != mp->ma_used ||
        mp->ma_used == 0 || k->dk_kind > 1) {
        return 0;
    }
    PyObject **entries = (PyObject **)ENTRIES311(k);
    if (k->dk_kind == 1) { /* str keys: (key, value) */
        *first = entries;
        *step = 2;
    }
    else { /* (hash, key, value) */
        *first = entries + 1;
        *step = 3;
    }
    return 1;
}

/* The index of name among a class's shared keys, or -1. */
static Py_ssize_t
shared_key_index(Keys311 *k, PyObject *name)
{
    if (k == NULL || k->dk_kind == 0 /* DICT_KEYS_GENERAL */) {
        return -1;
    }
    UnicodeEntry311 *entries = ENTRIES311(k);
    for (Py_ssize_t i = 0; i < k->dk_nentries; i++) {
        PyObject *key = entries[i].me_key;
        if (key == name) {
            return i;
        }
        if (key != NULL && PyUnicode_CheckExact(key)) {
            int eq = PyUnicode_Compare(key, name);
            if (eq == 0) {
                return i;
            }
        }
    }
    return -1;
}
#else
#define LAYOUT_311 0
#endif

typedef struct {
    void *keys;         /* the class's shared keys when the codes were made (3.11) */
    int has_dict;       /* its instances have a __dict__ */
    Py_ssize_t n;       /* its fields */
    Py_ssize_t n_values; /* of them, those read from the inline values (3.11) */
    Py_ssize_t n_slots; /* its classes' slots that are not fields */
    /* n codes; then n dict flags; then the n_slots slots' offsets */
    Py_ssize_t code[1];
} FieldReads;

/* 1 when field i's name is bound by the class to nothing that a lookup puts
 * before the instance's __dict__ (no data descriptor): the __dict__'s value
 * for it is then getattr's */
#define READS_DICT_OK(r, i) ((r)->code[(r)->n + (i)])
/* the offset of slot j of the class's slots that are not fields */
#define READS_SLOT(r, j) ((r)->code[2 * (r)->n + (j)])

/* Whether name (an exact str) is one of names. */
static int
name_in(PyObject *names, PyObject *name)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *x = PyTuple_GET_ITEM(names, i);
        if (x == name || (PyUnicode_CheckExact(x) && PyUnicode_Compare(x, name) == 0)) {
            return 1;
        }
    }
    return 0;
}

/* The slots of t and its bases that are not fields (names): their offsets
 * into out (when not NULL), and how many; -1 when a class has a member of
 * another kind than a slot, which the pure engine reads. As
 * _pure._outside_layout: the member descriptors of each heap class's own
 * dict. Reads dicts of classes only: no code runs. */
static Py_ssize_t
extra_slots(PyTypeObject *t, PyObject *names, Py_ssize_t *out)
{
    PyObject *mro = t->tp_mro;
    Py_ssize_t count = 0;
    if (mro == NULL || !PyTuple_CheckExact(mro)) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *c = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        PyObject *key, *d;
        Py_ssize_t pos = 0;
        if (!PyType_HasFeature(c, Py_TPFLAGS_HEAPTYPE) || c->tp_dict == NULL) {
            continue;
        }
        while (PyDict_Next(c->tp_dict, &pos, &key, &d)) {
            if (Py_TYPE(d) != &PyMemberDescr_Type || PyDescr_TYPE(d) != c) {
                continue;
            }
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type != T_OBJECT_EX || m->offset <= 0 || !PyUnicode_CheckExact(key)) {
                return -1;
            }
            if (!name_in(names, key)) {
                if (out != NULL) {
                    out[count] = m->offset;
                }
                count++;
            }
        }
    }
    return count;
}

/* How a record class's fields are read and its instances' own state
 * counted, worked out with its plan (so following the class's version tag):
 * a bytes object holding a FieldReads, or NULL (no error) when the pure
 * engine reads the class's instances (a lookup that is not CPython's generic
 * one, a member that is not a slot). */
static PyObject *
field_reads(PyTypeObject *t, PyObject *names)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names), n_slots;
    if (t->tp_getattro != PyObject_GenericGetAttr || (n_slots = extra_slots(t, names, NULL)) < 0) {
        return NULL;
    }
    PyObject *b = PyBytes_FromStringAndSize(
        NULL, offsetof(FieldReads, code) + (2 * n + n_slots + 1) * sizeof(Py_ssize_t));
    if (b == NULL) {
        PyErr_Clear();
        return NULL;
    }
    FieldReads *r = (FieldReads *)PyBytes_AS_STRING(b);
    r->keys = NULL;
    r->has_dict = t->tp_dictoffset != 0;
    r->n = n;
    r->n_values = 0;
    r->n_slots = n_slots;
    extra_slots(t, names, &READS_SLOT(r, 0));
#if LAYOUT_311
    if (values_reads_ok && PyType_HasFeature(t, Py_TPFLAGS_MANAGED_DICT) &&
        PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE)) {
        r->keys = SHARED_KEYS(t);
    }
#endif
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *d;
        r->code[i] = 0;
        READS_DICT_OK(r, i) = 0;
        if (!PyUnicode_CheckExact(name)) {
            continue;
        }
        d = _PyType_Lookup(t, name); /* borrowed; no user code runs */
        /* nothing, or a value whose lookup gives way to the instance's own:
         * a default such as 0 or None, a function (not a data descriptor,
         * and of a type that cannot become one) */
        int own_first = d == NULL || (PyType_HasFeature(Py_TYPE(d), Py_TPFLAGS_IMMUTABLETYPE) &&
                                      !(Py_TYPE(d)->tp_descr_get != NULL &&
                                        Py_TYPE(d)->tp_descr_set != NULL));
        READS_DICT_OK(r, i) = own_first;
        if (d != NULL && Py_TYPE(d) == &PyMemberDescr_Type) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & PY_AUDIT_READ) && m->offset > 0 &&
                PyType_IsSubtype(t, PyDescr_TYPE(d))) {
                r->code[i] = m->offset;
            }
        }
#if LAYOUT_311
        else if (r->keys != NULL && own_first) {
            Py_ssize_t ix = shared_key_index(r->keys, name);
            if (ix >= 0) {
                r->code[i] = -1 - ix;
                r->n_values++;
            }
        }
#endif
    }
    return b;
}

/* getattr(obj, name) for field i of a record whose class's reads are r (or
 * NULL), when its slot or (3.11) inline value holds it: a new reference;
 * else NULL, with no error set and no code run. */
static inline PyObject *
field_read_fast(PyObject *obj, const FieldReads *r, Py_ssize_t i)
{
    if (r != NULL) {
        Py_ssize_t code = r->code[i];
        PyObject *v = NULL;
        if (code > 0) {
            v = SLOT(obj, code);
        }
#if LAYOUT_311
        else if (code < 0) {
            PyObject **values = VALUES_OF(obj);
            if (values != NULL && (void *)SHARED_KEYS(Py_TYPE(obj)) == r->keys) {
                v = values[-1 - code];
            }
        }
#endif
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return NULL;
}

/* getattr(obj, name) for field i of a record whose class's reads are r (or
 * NULL): a new reference, or NULL with the error set. */
static inline PyObject *
field_read(PyObject *obj, const FieldReads *r, Py_ssize_t i, PyObject *name)
{
    PyObject *v = field_read_fast(obj, r, i);
    return v != NULL ? v : PyObject_GetAttr(obj, name);
}

/* ------------------------------------------------------------------------ */
/* Per-call knowledge of types.
 *
 * PLAN_LEAF entries are final for the call, as the pure engine's leaf_types
 * set is. Other plans depend on the class's attributes and are checked
 * against the class's version tag, which CPython changes whenever the class
 * or one of its bases is modified; so they are never stale. */

enum {
    PLAN_LEAF, PLAN_TUPLE_LEAF, PLAN_NAMEDTUPLE, PLAN_DATACLASS, PLAN_ATTRS, PLAN_CUSTOM,
    PLAN_PYTHON
};

typedef struct {
    PyTypeObject *type; /* strong */
    int plan;
    unsigned int version;
    PyObject *info; /* strong or NULL: namedtuple _fields; a record's aux when every field
                       is set, (names, (), (), None), or NULL if a field is static */
    PyObject *node; /* strong or NULL: this call's node for the info above */
    PyObject *reads_obj;     /* strong or NULL: a record's FieldReads, in a bytes object */
    const FieldReads *reads; /* its contents, or NULL */
} TypeEntry;

#define TC_INLINE 8

/* Double the capacity of an array that starts in its inline storage and moves
 * to the heap on its first growth, or raise it to need if that is more. On
 * failure: MemoryError set, -1 returned, the array unchanged. */
static int
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

typedef struct {
    TypeEntry *v; /* NULL until the first entry; then inline or on the heap */
    Py_ssize_t n, cap;
    TypeEntry inline_v[TC_INLINE];
} TypeCache;

static void
tc_clear(TypeCache *c)
{
    for (Py_ssize_t i = 0; i < c->n; i++) {
        Py_DECREF(c->v[i].type);
        Py_XDECREF(c->v[i].info);
        Py_XDECREF(c->v[i].node);
        Py_XDECREF(c->v[i].reads_obj);
    }
    if (c->v != c->inline_v) {
        PyMem_Free(c->v);
    }
    c->v = NULL;
    c->n = c->cap = 0;
}

static TypeEntry *
tc_find(TypeCache *c, PyTypeObject *t)
{
    for (Py_ssize_t i = 0; i < c->n; i++) {
        if (c->v[i].type == t) {
            return &c->v[i];
        }
    }
    return NULL;
}

static TypeEntry *
tc_add(TypeCache *c, PyTypeObject *t)
{
    if (c->v == NULL) {
        c->v = c->inline_v;
        c->cap = TC_INLINE;
    }
    if (c->n == c->cap) {
        void *v = c->v;
        if (grow_array(&v, c->inline_v, c->n, &c->cap, sizeof(TypeEntry), 0) < 0) {
            return NULL;
        }
        c->v = v;
    }
    TypeEntry *e = &c->v[c->n++];
    Py_INCREF(t);
    e->type = t;
    e->plan = PLAN_PYTHON;
    e->version = 0;
    e->info = NULL;
    e->node = NULL;
    e->reads_obj = NULL;
    e->reads = NULL;
    return e;
}

/* The aux data of a dataclass or attrs instance with every field set,
 * (names, (), (), None), from the class's fields (the value of its
 * __dataclass_fields__ or __attrs_attrs__), read as _pure._fields_info reads
 * them. *aux is NULL when a field is static: the pure engine handles those.
 * Returns -1 (error set) when the pure engine should decide. */
static int
fields_aux(PyObject *fields, int kind, PyObject **aux)
{
    PyObject *seq, *names = NULL;
    *aux = NULL;
    if (kind == K_DATACLASS ? !PyDict_CheckExact(fields) : !PyTuple_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "fields of an unexpected type");
        return -1;
    }
    seq = kind == K_DATACLASS ? PyDict_Values(fields) : PySequence_List(fields);
    if (seq == NULL || (names = PyList_New(0)) == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seq); i++) {
        PyObject *f = PyList_GET_ITEM(seq, i);
        if (kind == K_DATACLASS) {
            PyObject *ft = PyObject_GetAttr(f, s_field_type);
            if (ft == NULL) {
                goto fail;
            }
            Py_DECREF(ft);
            if (ft != FIELD_marker) {
                continue;
            }
        }
        /* f.name, then bool((f.metadata or {}).get("static", False)) */
        PyObject *name = PyObject_GetAttr(f, s_name);
        if (name == NULL || PyList_Append(names, name) < 0) {
            Py_XDECREF(name);
            goto fail;
        }
        Py_DECREF(name);
        PyObject *md = PyObject_GetAttr(f, s_metadata);
        if (md == NULL) {
            goto fail;
        }
        int is_static = PyObject_IsTrue(md);
        if (is_static > 0) {
            PyObject *v = PyObject_CallMethodObjArgs(md, s_get, s_static, Py_False, NULL);
            is_static = v == NULL ? -1 : PyObject_IsTrue(v);
            Py_XDECREF(v);
        }
        Py_DECREF(md);
        if (is_static < 0) {
            goto fail;
        }
        if (is_static) {
            Py_DECREF(seq);
            Py_DECREF(names);
            return 0;
        }
    }
    Py_SETREF(names, PyList_AsTuple(names));
    if (names != NULL) {
        *aux = PyTuple_Pack(4, names, empty_tuple, empty_tuple, Py_None);
    }
fail:
    Py_XDECREF(seq);
    Py_XDECREF(names);
    return *aux == NULL ? -1 : 0;
}

/* Decide the plan for a type that is none of the exact builtin containers.
 * Mirrors the tail of _pure.classify. */
static int
make_plan(TypeEntry *e)
{
    PyTypeObject *t = e->type;
    PyObject *v = NULL;
    int r;
    e->plan = PLAN_PYTHON;
    if ((PyObject *)t == OrderedDict_t || (PyObject *)t == defaultdict_t ||
        (PyObject *)t == deque_t) {
        goto done;
    }
    r = type_attr(t, s_tree_flatten, &v);
    if (r != 0) {
        return r < 0 ? -1 : 0;
    }
    if (v != NULL && v != Py_None) {
        Py_DECREF(v);
        /* __tree_unflatten__ must be callable, else the pure engine raises. */
        r = type_attr(t, s_tree_unflatten, &v);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
        int ok = v != NULL && PyCallable_Check(v);
        Py_XDECREF(v);
        if (ok) {
            e->plan = PLAN_CUSTOM;
        }
        goto done;
    }
    Py_XDECREF(v);
    if (PyType_IsSubtype(t, &PyTuple_Type)) {
        PyObject *a = NULL, *b = NULL;
        if ((r = type_attr(t, s_n_sequence_fields, &a)) != 0) {
            return r < 0 ? -1 : 0;
        }
        if ((r = type_attr(t, s_n_fields, &b)) != 0) {
            Py_XDECREF(a);
            return r < 0 ? -1 : 0;
        }
        int structseq = a != NULL && b != NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (structseq) {
            goto done; /* PLAN_PYTHON */
        }
        if ((r = type_attr(t, s_fields, &v)) != 0) {
            return r < 0 ? -1 : 0;
        }
        if (v != NULL && PyTuple_CheckExact(v)) {
            e->plan = PLAN_NAMEDTUPLE;
            e->info = v;
        }
        else {
            Py_XDECREF(v);
            e->plan = PLAN_TUPLE_LEAF;
        }
        goto done;
    }
    for (int kind = K_DATACLASS; kind <= K_ATTRS; kind++) {
        r = type_attr(t, kind == K_DATACLASS ? s_dataclass_fields : s_attrs_attrs, &v);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
        int custom = 0;
        if (v != NULL) {
            /* the pure engine's own test, once per class (and version) */
            PyObject *hook = PyObject_CallOneArg(py_customised, (PyObject *)t);
            if (hook == NULL) {
                Py_DECREF(v);
                return -1;
            }
            custom = hook != Py_None;
            Py_DECREF(hook);
        }
        if (v != NULL &&
            (custom || (kind == K_DATACLASS &&
                        _PyType_Lookup(t, s_getattribute) != object_getattribute_fn))) {
            /* The pure engine decides: it refuses a record whose class
             * customises attribute access (__getattr__, __getattribute__,
             * a __setattr__ neither dataclasses nor attrs wrote), which
             * cannot be rebuilt faithfully from its fields; and it reads a
             * dataclass that is a dict (dict's own __getattribute__). */
            Py_DECREF(v);
            goto done; /* PLAN_PYTHON */
        }
        if (v != NULL) {
            r = fields_aux(v, kind, &e->info);
            Py_DECREF(v);
            if (r < 0) {
                PyErr_Clear(); /* the pure engine raises it, in its own words */
            }
            else {
                e->plan = kind == K_DATACLASS ? PLAN_DATACLASS : PLAN_ATTRS;
                if (e->info != NULL) {
                    e->reads_obj = field_reads(t, PyTuple_GET_ITEM(e->info, 0));
                }
            }
            goto done;
        }
    }
    e->plan = PLAN_LEAF;
done:
    /* A version of 0 (none assigned) makes the plan be decided again each time. */
    e->version = type_version(t);
    return 0;
}

/* What make_plan found, remembered across calls for as long as neither the
 * class nor its metaclass changes: CPython gives a class a new version tag
 * whenever it or a base is modified, and never reuses a tag, so a (pointer,
 * tag) match is the same class, unchanged. No reference to the class is held.
 * (The fields of a dataclass or attrs class are read from the class when it
 * is first met; Field objects changed in place afterwards are not seen.) */
#define PLAN_CACHE 256

typedef struct {
    PyTypeObject *type; /* not owned; compared, never dereferenced */
    unsigned int tver, mver;
    int plan;
    PyObject *info;
    PyObject *reads_obj;
} SavedPlan;

static SavedPlan saved_plans[PLAN_CACHE];

static inline const FieldReads *
reads_of(PyObject *reads_obj)
{
    return reads_obj == NULL ? NULL : (const FieldReads *)PyBytes_AS_STRING(reads_obj);
}

static unsigned int
meta_version(PyTypeObject *t)
{
    PyTypeObject *meta = Py_TYPE(t);
    return meta == &PyType_Type ? 1 : type_version(meta);
}

static inline SavedPlan *
saved_slot(PyTypeObject *t)
{
    size_t h = ((size_t)t >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
    return &saved_plans[(h >> 20) & (PLAN_CACHE - 1)];
}

/* What make_plan found before for this class unchanged, if anything: 1 with
 * the entry set from it, else 0. Runs no code of the class's. */
static int
plan_saved(TypeEntry *e)
{
    PyTypeObject *t = e->type;
    SavedPlan *sp = saved_slot(t);
    unsigned int tv = type_version(t), mv = meta_version(t);
    if (tv != 0 && mv != 0 && sp->type == t && sp->tver == tv && sp->mver == mv) {
        e->plan = sp->plan;
        e->version = tv;
        Py_XINCREF(sp->info);
        Py_XSETREF(e->info, sp->info);
        Py_XINCREF(sp->reads_obj);
        Py_XSETREF(e->reads_obj, sp->reads_obj);
        e->reads = reads_of(e->reads_obj);
        return 1;
    }
    return 0;
}

/* how many plans make_plan has made (for tests: _plans_made()) */
static Py_ssize_t plans_made;

/* make_plan, and remember what it found; may run user code (the class's
 * descriptors, its fields' metadata). */
static int
plan_made(TypeEntry *e)
{
    PyTypeObject *t = e->type;
    SavedPlan *sp = saved_slot(t);
    unsigned int tv, mv;
    plans_made++;
    if (make_plan(e) < 0) {
        return -1;
    }
    e->reads = reads_of(e->reads_obj);
    tv = type_version(t);
    mv = meta_version(t);
    if (tv != 0 && mv != 0 && e->version == tv) {
        PyObject *old = sp->info, *old_reads = sp->reads_obj;
        Py_XINCREF(e->info);
        Py_XINCREF(e->reads_obj);
        sp->type = t;
        sp->tver = tv;
        sp->mver = mv;
        sp->plan = e->plan;
        sp->info = e->info;
        sp->reads_obj = e->reads_obj;
        Py_XDECREF(old);
        Py_XDECREF(old_reads);
    }
    return 0;
}

/* make_plan, or what it found before for this class unchanged */
static int
plan_for(TypeEntry *e)
{
    return plan_saved(e) ? 0 : plan_made(e);
}

/* Whether an entry's plan still holds: its class is unchanged since. */
static inline int
entry_fresh(TypeEntry *e)
{
    return e->version != 0 && type_version(e->type) == e->version;
}

/* Decide an entry's plan again if its class changed since it was made. */
static int
entry_refresh(TypeEntry *e)
{
    if (entry_fresh(e)) {
        return 0;
    }
    Py_CLEAR(e->info);
    Py_CLEAR(e->node);
    Py_CLEAR(e->reads_obj);
    e->reads = NULL;
    return plan_for(e);
}

/* ------------------------------------------------------------------------ */
/* The traversal stack */

typedef struct {
    PyObject *obj;      /* strong */
    PyObject *children; /* strong: tuple or list */
    PyObject *names;    /* strong or NULL */
    Py_ssize_t pos;     /* the next child; the one being visited is pos - 1 */
    Py_ssize_t n;
    int keymode;
    int live; /* children is the list being flattened itself, not a copy */
} Frame;

#define STACK_INLINE 64

typedef struct {
    Frame *v; /* inline_v or the heap */
    Py_ssize_t n, cap;
    /* pointer set of the frames' objects, used once the stack is deep */
    void **set;
    Py_ssize_t set_cap, set_n;
    /* counts of the frames' objects by a hash of their address: a cheap
     * "certainly not on the stack" once the stack is more than a few deep */
    uint32_t *counts;
    Py_ssize_t nlive; /* frames whose children are the caller's list itself */
    PyObject *view; /* strong or NULL: a StackView of this stack */
    Frame inline_v[STACK_INLINE];
} Stack;

static void
stack_init(Stack *s)
{
    s->v = s->inline_v;
    s->n = 0;
    s->cap = STACK_INLINE;
    s->set = NULL;
    s->set_cap = s->set_n = 0;
    s->counts = NULL;
    s->nlive = 0;
    s->view = NULL;
}

typedef struct {
    PyObject_HEAD
    Stack *s; /* NULL once detached */
} StackView;

static void
frame_clear(Frame *f)
{
    Py_CLEAR(f->obj);
    Py_CLEAR(f->children);
    Py_CLEAR(f->names);
}

static void
stack_clear(Stack *s)
{
    for (Py_ssize_t i = 0; i < s->n; i++) {
        frame_clear(&s->v[i]);
    }
    if (s->v != s->inline_v) {
        PyMem_Free(s->v);
    }
    PyMem_Free(s->set);
    PyMem_Free(s->counts);
    if (s->view != NULL) {
        ((StackView *)s->view)->s = NULL;
        Py_DECREF(s->view);
    }
    stack_init(s);
}

static Py_ssize_t
set_slot(Stack *s, void *p)
{
    size_t h = ((size_t)p >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
    Py_ssize_t mask = s->set_cap - 1;
    Py_ssize_t i = (Py_ssize_t)(h & (size_t)mask);
    while (s->set[i] != NULL && s->set[i] != p) {
        i = (i + 1) & mask;
    }
    return i;
}

static int set_insert(Stack *s, void *p);

static int
set_grow(Stack *s)
{
    void **old = s->set;
    Py_ssize_t oldcap = s->set_cap;
    Py_ssize_t cap = oldcap ? oldcap * 2 : 256;
    void **nw = PyMem_Calloc(cap, sizeof(void *));
    if (nw == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->set = nw;
    s->set_cap = cap;
    s->set_n = 0;
    for (Py_ssize_t i = 0; i < oldcap; i++) {
        if (old[i] != NULL) {
            s->set[set_slot(s, old[i])] = old[i];
            s->set_n++;
        }
    }
    PyMem_Free(old);
    return 0;
}

static int
set_insert(Stack *s, void *p)
{
    if ((s->set_n + 1) * 2 > s->set_cap && set_grow(s) < 0) {
        return -1;
    }
    Py_ssize_t i = set_slot(s, p);
    if (s->set[i] == NULL) {
        s->set[i] = p;
        s->set_n++;
    }
    return 0;
}

static void
set_remove(Stack *s, void *p)
{
    Py_ssize_t mask = s->set_cap - 1;
    Py_ssize_t i = set_slot(s, p);
    if (s->set[i] == NULL) {
        return;
    }
    s->set[i] = NULL;
    s->set_n--;
    /* backward-shift deletion for linear probing */
    Py_ssize_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        void *q = s->set[j];
        if (q == NULL) {
            break;
        }
        size_t h = ((size_t)q >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
        Py_ssize_t k = (Py_ssize_t)(h & (size_t)mask);
        /* move q to i when its home k is not cyclically in (i, j] */
        if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }
        s->set[i] = q;
        s->set[j] = NULL;
        i = j;
    }
}

#define SET_FROM_DEPTH 256
#define COUNTS_FROM_DEPTH 8
#define NCOUNTS 256

static inline size_t
count_slot(void *p)
{
    size_t h = ((size_t)p >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
    return (h >> 48) & (NCOUNTS - 1);
}

/* Is obj the object of a frame on the stack? -1 on error (no memory). */
static int
stack_holds(Stack *s, PyObject *obj)
{
    if (s->counts == NULL && s->n >= COUNTS_FROM_DEPTH) {
        s->counts = PyMem_Calloc(NCOUNTS, sizeof(uint32_t));
        if (s->counts == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < s->n; i++) {
            s->counts[count_slot(s->v[i].obj)]++;
        }
    }
    if (s->counts != NULL && s->counts[count_slot(obj)] == 0) {
        return 0;
    }
    if (s->set != NULL) {
        return s->set[set_slot(s, obj)] == obj;
    }
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->v[i].obj == obj) {
            return 1;
        }
    }
    return 0;
}

/* Push a frame; steals children and names. */
static int
stack_push(Stack *s, PyObject *obj, PyObject *children, PyObject *names, int keymode, int live,
           int track)
{
    if (s->n == s->cap) {
        void *v = s->v;
        if (grow_array(&v, s->inline_v, s->n, &s->cap, sizeof(Frame), 0) < 0) {
            Py_DECREF(children);
            Py_XDECREF(names);
            return -1;
        }
        s->v = v;
    }
    if (track) {
        if (s->set == NULL && s->n >= SET_FROM_DEPTH) {
            for (Py_ssize_t i = 0; i < s->n; i++) {
                if (set_insert(s, s->v[i].obj) < 0) {
                    Py_DECREF(children);
                    Py_XDECREF(names);
                    return -1;
                }
            }
        }
        if (s->set != NULL && set_insert(s, obj) < 0) {
            Py_DECREF(children);
            Py_XDECREF(names);
            return -1;
        }
        if (s->counts != NULL) {
            s->counts[count_slot(obj)]++;
        }
    }
    Frame *f = &s->v[s->n++];
    Py_INCREF(obj);
    f->obj = obj;
    f->children = children;
    f->names = names;
    f->pos = 0;
    f->n = PyTuple_Check(children) ? PyTuple_GET_SIZE(children) : PyList_GET_SIZE(children);
    f->keymode = keymode;
    f->live = live;
    s->nlive += live;
    return 0;
}

static void
stack_pop(Stack *s)
{
    Frame *f = &s->v[--s->n];
    if (s->set != NULL) {
        set_remove(s, f->obj);
    }
    if (s->counts != NULL) {
        s->counts[count_slot(f->obj)]--;
    }
    s->nlive -= f->live;
    frame_clear(f);
}

/* The pure engine copies a list when it meets it. The C engine reads the
 * list itself for as long as no user code can run, and copies every list
 * still being read just before anything that could run user code (is_leaf,
 * __tree_flatten__, a rule, an attribute, a key's __lt__ or __eq__, ...):
 * until then the list cannot have changed, so the copy is the same. */
static int
stack_freeze(Stack *s)
{
    for (Py_ssize_t i = s->n - 1; s->nlive > 0 && i >= 0; i--) {
        Frame *f = &s->v[i];
        if (f->live) {
            PyObject *tup = PyList_AsTuple(f->children);
            if (tup == NULL) {
                return -1;
            }
            Py_SETREF(f->children, tup);
            f->live = 0;
            s->nlive--;
        }
    }
    return 0;
}

/* Only a finalizer run by the garbage collector could change a list being
 * read; never read past its end if one did. */
static int
frame_check(Frame *f)
{
    if (f->live && PyList_GET_SIZE(f->children) != f->n) {
        PyErr_SetString(PyExc_RuntimeError, "a list changed size while it was being flattened");
        return -1;
    }
    return 0;
}

/* The stack as the pure engine's helpers see it: a read-only sequence whose
 * items are frames in the pure engine's format, [children, position,
 * keymode, names, obj], made only when read (which is when an error message
 * needs the path). One view per call, made when first needed; when the call
 * returns it is detached and reads as empty, so nothing dangles if a
 * traceback keeps it. It holds no Python objects, so it needs no GC. */


static Py_ssize_t
sv_len(PyObject *self)
{
    Stack *s = ((StackView *)self)->s;
    return s ? s->n : 0;
}

static PyObject *
sv_item(PyObject *self, Py_ssize_t i)
{
    Stack *s = ((StackView *)self)->s;
    if (s == NULL || i < 0 || i >= s->n) {
        PyErr_SetString(PyExc_IndexError, "stack index out of range");
        return NULL;
    }
    Frame *f = &s->v[i];
    return Py_BuildValue("[OniOO]", f->children, f->pos, f->keymode,
                         f->names ? f->names : Py_None, f->obj);
}

static PySequenceMethods sv_as_sequence = {
    .sq_length = sv_len,
    .sq_item = sv_item,
};

static PyTypeObject StackView_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pytree_kit._speedups.StackView",
    .tp_basicsize = sizeof(StackView),
    .tp_dealloc = (destructor)PyObject_Free,
    .tp_as_sequence = &sv_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The C engine's traversal stack, read by the pure engine's error helpers.",
};

/* A new reference to the stack's view (made on first use). */
static PyObject *
stack_py(Stack *s)
{
    if (s->view == NULL) {
        StackView *v = PyObject_New(StackView, &StackView_Type);
        if (v == NULL) {
            return NULL;
        }
        v->s = s;
        s->view = (PyObject *)v;
    }
    Py_INCREF(s->view);
    return s->view;
}

static inline PyObject *
frame_item(Frame *f, Py_ssize_t i)
{
    return PyTuple_Check(f->children) ? PyTuple_GET_ITEM(f->children, i)
                                      : PyList_GET_ITEM(f->children, i);
}

/* Path keys (_keys.py) are made without calling their class, whose
 * __init__ only sets the one slot: the type allocates the instance and the
 * slot's member descriptor sets it, both through public type slots. key_init
 * checks on import that a key made so equals one made by the class, with the
 * same slot and no __dict__; where anything differs, the class is called. */
static PyObject *key_class[3]; /* borrowed: SequenceKey_t, DictKey_t, GetAttrKey_t */
static PyObject *key_slot[3];  /* strong member descriptors, or NULL: call the class */

PyObject *
pk_key(int which, PyObject *value)
{
    PyTypeObject *t = (PyTypeObject *)key_class[which];
    PyObject *d = key_slot[which];
    if (d == NULL) {
        return PyObject_CallOneArg((PyObject *)t, value);
    }
    PyObject *k = t->tp_alloc(t, 0);
    if (k != NULL && Py_TYPE(d)->tp_descr_set(d, k, value) < 0) {
        Py_CLEAR(k);
    }
    return k;
}

PyObject *
pk_key_class(int which)
{
    return key_class[which];
}

/* Whether pk_key's own way makes, for value, what the class makes. */
static int
key_same(int which, const char *slot, PyObject *value)
{
    PyObject *mine = pk_key(which, value);
    PyObject *theirs = PyObject_CallOneArg(key_class[which], value);
    int same = 0;
    if (mine != NULL && theirs != NULL && Py_TYPE(mine) == Py_TYPE(theirs) &&
        !PyObject_HasAttrString(mine, "__dict__")) {
        PyObject *a = PyObject_GetAttrString(mine, slot), *b = PyObject_GetAttrString(theirs, slot);
        same = a != NULL && a == b && a == value &&
               PyObject_RichCompareBool(mine, theirs, Py_EQ) == 1 &&
               PyObject_Hash(mine) == PyObject_Hash(theirs);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    PyErr_Clear();
    return same;
}

static int
key_init(void)
{
    static const char *const slots[3] = {"idx", "key", "name"};
    key_class[PK_KEY_SEQUENCE] = SequenceKey_t;
    key_class[PK_KEY_DICT] = DictKey_t;
    key_class[PK_KEY_ATTR] = GetAttrKey_t;
    for (int w = 0; w < 3; w++) {
        PyTypeObject *t = (PyTypeObject *)key_class[w];
        PyObject *d = PyObject_GetAttrString(key_class[w], slots[w]);
        if (d == NULL) {
            return -1;
        }
        if (!PyType_Check(key_class[w]) || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            Py_TYPE(d)->tp_descr_set == NULL || t->tp_alloc == NULL ||
            t->tp_new != PyBaseObject_Type.tp_new) {
            Py_DECREF(d);
            continue;
        }
        key_slot[w] = d;
        PyObject *probe = w == PK_KEY_SEQUENCE ? PyLong_FromLong(3) : PyUnicode_FromString("k");
        if (probe == NULL) {
            return -1;
        }
        if (!key_same(w, slots[w], probe)) {
            Py_CLEAR(key_slot[w]);
        }
        Py_DECREF(probe);
    }
    return 0;
}

/* The key of the child being visited in frame f, as _pure._key. */
static PyObject *
frame_key(Frame *f, Py_ssize_t i)
{
    if (f->keymode == KM_SEQ) {
        PyObject *idx = PyLong_FromSsize_t(i);
        if (idx == NULL) {
            return NULL;
        }
        PyObject *k = pk_key(PK_KEY_SEQUENCE, idx);
        Py_DECREF(idx);
        return k;
    }
    PyObject *name = PySequence_GetItem(f->names, i);
    if (name == NULL) {
        return NULL;
    }
    PyObject *k = pk_key(f->keymode == KM_MAP ? PK_KEY_DICT : PK_KEY_ATTR, name);
    Py_DECREF(name);
    return k;
}

/* ------------------------------------------------------------------------ */
/* Growable arrays of strong references */

#define VEC_INLINE 128

typedef struct {
    PyObject **v; /* inline_v or the heap */
    Py_ssize_t n, cap;
    PyObject *inline_v[VEC_INLINE];
} Vec;

static void
vec_init(Vec *a)
{
    a->v = a->inline_v;
    a->n = 0;
    a->cap = VEC_INLINE;
}

static int
vec_grow(Vec *a, Py_ssize_t need)
{
    void *v = a->v;
    if (grow_array(&v, a->inline_v, a->n, &a->cap, sizeof(PyObject *), need) < 0) {
        return -1;
    }
    a->v = v;
    return 0;
}

/* Room for k more items with no further growth. */
static inline int
vec_reserve(Vec *a, Py_ssize_t k)
{
    return a->cap - a->n >= k ? 0 : vec_grow(a, a->n + k);
}

static inline int
vec_push(Vec *a, PyObject *o)
{
    /* steals o */
    if (a->n == a->cap && vec_grow(a, 0) < 0) {
        Py_DECREF(o);
        return -1;
    }
    a->v[a->n++] = o;
    return 0;
}

/* Append new references to src[0 .. k). */
static inline int
vec_extend(Vec *a, PyObject *const *src, Py_ssize_t k)
{
    if (vec_reserve(a, k) < 0) {
        return -1;
    }
    PyObject **dst = a->v + a->n;
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_INCREF(src[j]);
        dst[j] = src[j];
    }
    a->n += k;
    return 0;
}

/* The item array of a tuple or a list. */
static inline PyObject **
seq_items(PyObject *seq)
{
    return PyTuple_Check(seq) ? ((PyTupleObject *)seq)->ob_item : ((PyListObject *)seq)->ob_item;
}

static void
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

static PyObject *
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

/* A new tuple (or list) of ch[0 .. n). */
static PyObject *
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

/* Moves the references into a new list: a heap array becomes the list's own
 * storage (lists free theirs with PyMem_Free), trimmed when mostly unused. */
static PyObject *
vec_to_list(Vec *a)
{
    PyObject *l;
    if (a->v == a->inline_v) {
        l = PyList_New(a->n);
        if (l == NULL) {
            return NULL;
        }
        if (a->n) {
            memcpy(((PyListObject *)l)->ob_item, a->v, a->n * sizeof(PyObject *));
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

/* A list of n items that the caller sets at once, before anything else can
 * see the list or run the GC: PyList_New(n) less its zeroing of the items
 * (PyList_New(0), then items from malloc, as vec_to_list hands a list its
 * array). New reference. */
static PyObject *
list_to_fill(Py_ssize_t n)
{
    if (n == 0 || (size_t)n > PY_SSIZE_T_MAX / sizeof(PyObject *)) {
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

/* Append a new reference to x. */
static inline int
emit(Vec *a, PyObject *x)
{
    Py_INCREF(x);
    return vec_push(a, x);
}

/* One leaf, x: into the leaves, and its node into the nodes when a spec is built. */
static inline int
emit_leaf(Vec *leaves, Vec *nodes, int mode, PyObject *x)
{
    if (emit(leaves, x) < 0) {
        return -1;
    }
    if (mode) {
        Py_INCREF(LEAF_NODE);
        return vec_push(nodes, LEAF_NODE);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Classification: what _pure.classify returns, or a leaf. */

typedef struct {
    PyObject *node;     /* strong, or NULL when no spec is built */
    PyObject *children; /* strong: tuple or list */
    PyObject *names;    /* strong or NULL */
    int keymode;
    int live;
    int dict_kind; /* DICT or DEFAULTDICT: the insertion order may be recorded */
    Py_ssize_t direct_n; /* > 0: no children to visit; these leaves follow the node */
    PyObject *direct[32]; /* borrowed from the dict (nothing runs before they are taken),
                             or strong when direct_owned (a record's fields) */
    int direct_owned;
    int order_known; /* the dict's order was found already: order, or the same when NULL */
    PyObject *order; /* strong or NULL: the insertion order, when it differs */
} Found;

typedef struct {
    PyObject *is_leaf; /* NULL for None */
    PyObject *rules;   /* exact dict or NULL */
    int mode;          /* 0 leaves, 1 and spec, 2 and paths */
    TypeCache types;
    PyObject *pycache; /* the pure engine's per-call cache, made when first needed */
    int atom_leaf[6];
    PyTypeObject *last_leaf; /* the type of the last leaf classified by type */
    int dict_misses;          /* small dicts in a row not found in dict_memo */
    PyObject *seq_nodes[2][16]; /* strong where seq_made has the bit: this call's tuple and
                                   list nodes by arity */
    uint32_t seq_made;
} Ctx;

/* Drop the references f->direct holds, if it holds any. */
static void
release_direct(Found *f)
{
    if (f->direct_owned) {
        for (Py_ssize_t i = 0; i < f->direct_n; i++) {
            Py_DECREF(f->direct[i]);
        }
        f->direct_owned = 0;
    }
}

/* The node of a tuple or list: equal nodes are shared within a call. */
static PyObject *
seq_node(Ctx *c, int kind, Py_ssize_t n)
{
    if (n >= 16) {
        return make_node(kind, Py_None, n, Py_None);
    }
    PyObject **slot = &c->seq_nodes[kind == K_LIST][n];
    uint32_t bit = (uint32_t)1 << ((kind == K_LIST) * 16 + n);
    if (!(c->seq_made & bit)) {
        if ((*slot = make_node(kind, Py_None, n, Py_None)) == NULL) {
            return NULL;
        }
        c->seq_made |= bit;
    }
    Py_INCREF(*slot);
    return *slot;
}

static PyTypeObject *const atom_types[6] = {
    &PyLong_Type, &PyFloat_Type, &PyUnicode_Type, &PyBytes_Type, &PyBool_Type, &PyComplex_Type,
};

static int
ctx_init(Ctx *c, PyObject *is_leaf, PyObject *rules, int mode)
{
    /* no memset: the type cache's and the nodes' storage is set when used */
    c->types.v = NULL;
    c->types.n = c->types.cap = 0;
    c->rules = NULL;
    c->pycache = NULL;
    c->last_leaf = NULL;
    c->dict_misses = 0;
    c->seq_made = 0;
    c->is_leaf = is_leaf == Py_None ? NULL : is_leaf;
    c->mode = mode;
    if (rules != NULL && rules != Py_None) {
        if (!PyDict_CheckExact(rules)) {
            PyErr_SetString(PyExc_TypeError, "rules must be a dict (see pytree_kit._kinds.check_rules)");
            return -1;
        }
        if (PyDict_GET_SIZE(rules)) {
            c->rules = rules;
        }
    }
    for (int i = 0; i < 6; i++) {
        int in_rules = 0;
        if (c->rules != NULL) {
            in_rules = PyDict_Contains(c->rules, (PyObject *)atom_types[i]);
            if (in_rules < 0) {
                return -1;
            }
        }
        c->atom_leaf[i] = !in_rules;
    }
    return 0;
}

static void
ctx_clear(Ctx *c)
{
    tc_clear(&c->types);
    Py_CLEAR(c->pycache);
    for (int i = 0; c->seq_made; i++, c->seq_made >>= 1) {
        if (c->seq_made & 1) {
            Py_DECREF(c->seq_nodes[i >> 4][i & 15]);
        }
    }
}

/* Is a value of type t a leaf by its type alone, with no user code to run? */
static inline int
known_leaf(Ctx *c, PyTypeObject *t)
{
    if (t == c->last_leaf) {
        return 1;
    }
    if (t == &PyList_Type || t == &PyDict_Type || t == &PyTuple_Type) {
        return 0; /* classify decides: a rule may name them */
    }
    for (int i = 0; i < 6; i++) {
        if (t == atom_types[i]) {
            if (c->atom_leaf[i]) {
                c->last_leaf = t;
            }
            return c->atom_leaf[i];
        }
    }
    TypeEntry *e = tc_find(&c->types, t);
    if (e != NULL && e->plan == PLAN_LEAF) {
        c->last_leaf = t;
        return 1;
    }
    return 0;
}

static int
classify_python(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    /* _pure.classify(obj, t, rules, stack, cache) */
    if (c->pycache == NULL && (c->pycache = PyDict_New()) == NULL) {
        return -1;
    }
    PyObject *st = stack_py(s);
    if (st == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallFunctionObjArgs(py_classify, obj, (PyObject *)Py_TYPE(obj),
                                                 c->rules ? c->rules : Py_None, st, c->pycache,
                                                 NULL);
    Py_DECREF(st);
    if (res == NULL) {
        return -1;
    }
    if (res == Py_None) {
        Py_DECREF(res);
        return 0;
    }
    if (!PyTuple_CheckExact(res) || PyTuple_GET_SIZE(res) != 4) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "pytree_kit: classify returned a bad value");
        return -1;
    }
    PyObject *node = PyTuple_GET_ITEM(res, 0);
    PyObject *children = PyTuple_GET_ITEM(res, 1);
    PyObject *names = PyTuple_GET_ITEM(res, 3);
    long km = PyLong_AsLong(PyTuple_GET_ITEM(res, 2));
    if (km == -1 && PyErr_Occurred()) {
        Py_DECREF(res);
        return -1;
    }
    if (PyTuple_Check(children) || PyList_Check(children)) {
        Py_INCREF(children);
    }
    else {
        children = PySequence_Tuple(children);
        if (children == NULL) {
            Py_DECREF(res);
            return -1;
        }
    }
    f->children = children;
    f->node = node;
    Py_INCREF(node);
    f->names = names == Py_None ? NULL : names;
    Py_XINCREF(f->names);
    f->keymode = (int)km;
    f->live = 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    f->dict_kind = kind == K_DICT || kind == K_DEFAULTDICT;
    Py_DECREF(res);
    return 1;
}

/* What __tree_flatten__ or a rule returned, as _pure._user_children validates
 * it. The common shape, (list, tuple or dict children, hashable aux), is read
 * here; anything else (optree's (children, aux, entries) included) goes to
 * the pure helper. On success sets *children (a tuple), *tail (the node's aux
 * data after the rule: (aux, keys) or (aux, None, entries); only when tail is
 * not NULL) and *names (the keys or entries, or None), all strong references. */
static int
user_result(Ctx *c, Stack *s, PyObject *res, PyTypeObject *t, PyObject *helper,
            PyObject **children, PyObject **tail, PyObject **names, int *keymode)
{
    if (PyTuple_CheckExact(res) && PyTuple_GET_SIZE(res) == 2) {
        PyObject *ch = PyTuple_GET_ITEM(res, 0);
        PyObject *ax = PyTuple_GET_ITEM(res, 1);
        int seq = PyTuple_CheckExact(ch) || PyList_CheckExact(ch);
        if (seq || PyDict_CheckExact(ch)) {
            Py_hash_t h = PyObject_Hash(ax);
            if (h != -1 && seq) {
                *children = PySequence_Tuple(ch);
                if (*children == NULL) {
                    return -1;
                }
                if (tail != NULL && (*tail = PyTuple_Pack(2, ax, Py_None)) == NULL) {
                    Py_CLEAR(*children);
                    return -1;
                }
                Py_INCREF(Py_None);
                *names = Py_None;
                *keymode = KM_SEQ;
                return 0;
            }
            if (h != -1) {
                /* a dict: its keys name the children, in insertion order
                 * (nothing below runs Python code, so the dict cannot change) */
                Py_ssize_t n = PyDict_GET_SIZE(ch), pos = 0, k = 0;
                PyObject *kt = PyTuple_New(n), *vt = PyTuple_New(n), *key, *val;
                if (kt == NULL || vt == NULL) {
                    Py_XDECREF(kt);
                    Py_XDECREF(vt);
                    return -1;
                }
                while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
                    Py_INCREF(key);
                    Py_INCREF(val);
                    PyTuple_SET_ITEM(kt, k, key);
                    PyTuple_SET_ITEM(vt, k, val);
                    k++;
                }
                if (tail != NULL && (*tail = PyTuple_Pack(2, ax, kt)) == NULL) {
                    Py_DECREF(kt);
                    Py_DECREF(vt);
                    return -1;
                }
                *children = vt;
                *names = kt;
                *keymode = KM_MAP;
                return 0;
            }
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                return -1;
            }
            PyErr_Clear();
        }
    }
    PyObject *st = stack_py(s);
    if (st == NULL) {
        return -1;
    }
    PyObject *out = PyObject_CallFunctionObjArgs(helper, res, st, (PyObject *)t, NULL);
    Py_DECREF(st);
    if (out == NULL) {
        return -1;
    }
    /* (children, tail, names, mode) */
    PyObject *ch = PyTuple_GET_ITEM(out, 0);
    *children = PySequence_Tuple(ch);
    if (*children == NULL) {
        Py_DECREF(out);
        return -1;
    }
    if (tail != NULL) {
        *tail = Py_NewRef(PyTuple_GET_ITEM(out, 1));
    }
    *names = PyTuple_GET_ITEM(out, 2);
    Py_INCREF(*names);
    *keymode = (int)PyLong_AsLong(PyTuple_GET_ITEM(out, 3));
    Py_DECREF(out);
    return 0;
}

/* A RULE node's aux data: (rule, *tail). */
static PyObject *
rule_aux(PyObject *rule, PyObject *tail)
{
    Py_ssize_t n = PyTuple_GET_SIZE(tail);
    PyObject *a = PyTuple_New(n + 1);
    if (a == NULL) {
        return NULL;
    }
    Py_INCREF(rule);
    PyTuple_SET_ITEM(a, 0, rule);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(tail, i);
        Py_INCREF(x);
        PyTuple_SET_ITEM(a, i + 1, x);
    }
    return a;
}

/* The node and children of what a rule (rule != NULL) or __tree_flatten__
 * returned, res: a RULE node (rule, *tail) or a CUSTOM node (tail). */
static int
user_node(Ctx *c, Stack *s, PyObject *res, PyTypeObject *t, PyObject *rule, Found *f)
{
    PyObject *children, *tail = NULL, *names;
    int km;
    if (user_result(c, s, res, t, rule ? py_rule_result : py_custom_result, &children,
                    c->mode ? &tail : NULL, &names, &km) < 0) {
        return -1;
    }
    f->node = NULL;
    if (c->mode) {
        PyObject *a = rule ? rule_aux(rule, tail) : Py_NewRef(tail);
        if (a != NULL) {
            f->node = make_node(rule ? K_RULE : K_CUSTOM, (PyObject *)t,
                                PyTuple_GET_SIZE(children), a);
            Py_DECREF(a);
        }
        if (f->node == NULL) {
            Py_DECREF(children);
            Py_DECREF(tail);
            Py_DECREF(names);
            return -1;
        }
    }
    Py_XDECREF(tail);
    f->children = children;
    f->names = names == Py_None ? NULL : names;
    if (names == Py_None) {
        Py_DECREF(names);
    }
    f->keymode = km;
    f->live = 0;
    f->dict_kind = 0;
    return 1;
}

/* After code ran while a record's fields were read (a getattr), which may
 * have changed the instance: 1 when obj still keeps nothing outside its
 * fields (no slot set that is not a field's; every entry of its __dict__,
 * or on 3.11 of its inline values, a field's), 0 when the pure engine must
 * decide, -1 on error. Looks at names only: no code runs. */
static PK_NO_INLINE int
record_recheck(PyObject *obj, const FieldReads *r, PyObject *names)
{
    Py_ssize_t found = 0;
    for (Py_ssize_t j = 0; j < r->n_slots; j++) {
        if (SLOT(obj, READS_SLOT(r, j)) != NULL) {
            return 0;
        }
    }
    if (!r->has_dict) {
        return 1;
    }
#if LAYOUT_311
    Py_ssize_t stored = 0;
    PyObject **values = NULL;
    if (r->keys != NULL && (void *)SHARED_KEYS(Py_TYPE(obj)) == r->keys) {
        values = VALUES_OF(obj);
    }
    if (values != NULL) {
        Keys311 *k = r->keys;
        for (Py_ssize_t j = 0; j < k->dk_nentries; j++) {
            stored += values[j] != NULL;
        }
        for (Py_ssize_t i = 0; i < r->n; i++) {
            found += r->code[i] < 0 && values[-1 - r->code[i]] != NULL;
        }
        return stored == found;
    }
#endif
    PyObject *dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) {
        return -1;
    }
    int ok = PyDict_Check(dict);
    for (Py_ssize_t i = 0; ok && i < r->n; i++) {
        if (READS_DICT_OK(r, i) && r->code[i] <= 0) {
            /* an exact str key looked up in a dict: no code runs */
            PyObject *x = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(names, i));
            if (x == NULL && PyErr_Occurred()) {
                Py_DECREF(dict);
                return -1;
            }
            found += x != NULL;
        }
    }
    ok = ok && PyDict_GET_SIZE(dict) == found;
    Py_DECREF(dict);
    return ok;
}

/* Reads the fields of obj, a record whose class's reads are r, into v (new
 * references; NULL for an unset field, counted in *absent) as getattr
 * would, and makes sure that obj keeps no state outside them: nothing in a
 * slot that is not a field's, and nothing in its __dict__ (or, on 3.11, its
 * inline values) but the fields read from there. Returns 1; 2 when obj does
 * keep, or may keep, such state, for the pure engine to decide (its
 * cached_property values are not state, say) with no reference held; -1 on
 * error with none held. s, when not NULL, is frozen before anything that may
 * run code (getattr of a field that obj does not hold itself).
 *
 * The __dict__ of an instance of a class with a managed dict (3.11+) is
 * made by PyObject_GenericGetDict when it has none yet, as `vars(obj)`
 * would (on 3.11 the inline values are counted instead). */
static PK_ALWAYS_INLINE int
record_read(PyObject *obj, const FieldReads *r, PyObject *names, PyObject **v,
            Py_ssize_t *absent, Stack *s)
{
    Py_ssize_t n = r->n, stored = 0, found = 0, i = 0;
    PyObject *dict = NULL;
#if LAYOUT_311
    PyObject **values = NULL;
#endif
    int values_all_fields = 0, ran = 0;
    *absent = 0;
    for (Py_ssize_t j = 0; j < r->n_slots; j++) {
        if (SLOT(obj, READS_SLOT(r, j)) != NULL) {
            return 2;
        }
    }
    if (r->has_dict) {
#if LAYOUT_311
        if (r->keys != NULL && (void *)SHARED_KEYS(Py_TYPE(obj)) == r->keys) {
            values = VALUES_OF(obj);
        }
        if (values != NULL) {
            Keys311 *k = r->keys;
            if (k->dk_nentries == r->n_values) {
                /* every value an instance can hold inline is a field's */
                values_all_fields = 1;
            }
            else {
                for (Py_ssize_t j = 0; j < k->dk_nentries; j++) {
                    stored += values[j] != NULL;
                }
            }
        }
        else
#endif
        {
            if ((dict = PyObject_GenericGetDict(obj, NULL)) == NULL) {
                return -1;
            }
            stored = PyDict_Check(dict) ? PyDict_GET_SIZE(dict) : n + 1;
        }
        if (stored > n) {
            Py_XDECREF(dict);
            return 2;
        }
    }
    for (; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *x = NULL;
        Py_ssize_t code = r->code[i];
        if (code > 0) {
            x = SLOT(obj, code);
        }
#if LAYOUT_311
        else if (code < 0 && values != NULL) {
            x = values[-1 - code];
            found += x != NULL;
        }
#endif
        else if (dict != NULL && READS_DICT_OK(r, i)) {
            /* an exact str key looked up in a dict: no code runs */
            x = PyDict_GetItemWithError(dict, name);
            if (x == NULL && PyErr_Occurred()) {
                goto fail;
            }
            found += x != NULL;
        }
        if (x != NULL) {
            Py_INCREF(x);
            v[i] = x;
            continue;
        }
        /* getattr may run code: copy the lists being read first */
        if (s != NULL && stack_freeze(s) < 0) {
            goto fail;
        }
        ran = 1;
        if ((v[i] = PyObject_GetAttr(obj, name)) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                goto fail;
            }
            PyErr_Clear();
            (*absent)++;
        }
    }
    Py_XDECREF(dict);
    /* what getattr ran may have changed the instance: counted again */
    int kept = ran ? record_recheck(obj, r, names)
                   : !r->has_dict || values_all_fields || found == stored;
    if (kept != 1) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_CLEAR(v[k]);
        }
        return kept < 0 ? -1 : 2;
    }
    return 1;
fail:
    Py_XDECREF(dict);
    for (Py_ssize_t k = 0; k < i; k++) {
        Py_CLEAR(v[k]);
    }
    return -1;
}

/* _pure._record_fields for the common case: no static field, not a dict.
 * Returns 1 with f set, or 2 when the pure engine should do it. With a
 * stack (flatten and leaves), a record whose fields are all leaves by their
 * type gives them as f->direct (strong references, f->direct_owned), with no
 * children to visit. */
static int
record_fields(Ctx *c, Stack *s, PyObject *obj, TypeEntry *e, int kind, Found *f, int want_node)
{
    if (e->info == NULL || e->reads == NULL || PyDict_Check(obj)) {
        return 2;
    }
    PyObject *full = e->info; /* (names, (), (), None) */
    PyObject *names = PyTuple_GET_ITEM(full, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(names), absent = 0;
    /* the values: in f->direct when they fit, else in a tuple */
    PyObject *children = NULL, **v = f->direct;
    if (s == NULL || n > (Py_ssize_t)(sizeof(f->direct) / sizeof(f->direct[0]))) {
        if ((children = PyTuple_New(n)) == NULL) {
            return -1;
        }
        v = ((PyTupleObject *)children)->ob_item;
    }
    int read = record_read(obj, e->reads, names, v, &absent, s);
    if (read != 1) {
        Py_XDECREF(children); /* its items are cleared */
        return read;
    }
    f->node = NULL;
    f->keymode = KM_ATTR;
    f->live = 0;
    f->dict_kind = 0;
    if (absent == 0 && want_node) {
        if (e->node == NULL) {
            e->node = make_node(kind, (PyObject *)e->type, n, full);
        }
        if (e->node == NULL) {
            goto fail;
        }
        Py_INCREF(e->node);
        f->node = e->node;
    }
    if (absent == 0 && children == NULL && n > 0 && c->is_leaf == NULL && c->mode != 2) {
        Py_ssize_t i = 0;
        while (i < n && known_leaf(c, Py_TYPE(v[i]))) {
            i++;
        }
        int held = i == n ? stack_holds(s, obj) : 1;
        if (held < 0) {
            goto fail;
        }
        if (!held) {
            f->direct_n = n;
            f->direct_owned = 1;
            Py_INCREF(empty_tuple);
            f->children = empty_tuple;
            Py_INCREF(names);
            f->names = names;
            return 1;
        }
    }
    if (children == NULL) {
        if ((children = PyTuple_New(n)) == NULL) {
            goto fail;
        }
        if (n) {
            memcpy(((PyTupleObject *)children)->ob_item, v, n * sizeof(PyObject *));
        }
    }
    if (absent == 0) {
        f->children = children;
        Py_INCREF(names);
        f->names = names;
        return 1;
    }
    /* some fields are unset: they go to the aux data */
    PyObject *present = PyTuple_New(n - absent), *vals = PyTuple_New(n - absent);
    PyObject *gone = PyTuple_New(absent), *aux = NULL;
    if (present == NULL || vals == NULL || gone == NULL) {
        goto fail_absent;
    }
    for (Py_ssize_t i = 0, p = 0, g = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *x = PyTuple_GET_ITEM(children, i);
        Py_INCREF(name);
        if (x == NULL) {
            PyTuple_SET_ITEM(gone, g++, name);
        }
        else {
            PyTuple_SET_ITEM(present, p, name);
            Py_INCREF(x);
            PyTuple_SET_ITEM(vals, p++, x);
        }
    }
    if (want_node) {
        aux = PyTuple_Pack(4, present, empty_tuple, gone, Py_None);
        if (aux == NULL) {
            goto fail_absent;
        }
        f->node = make_node(kind, (PyObject *)e->type, n - absent, aux);
        Py_DECREF(aux);
        if (f->node == NULL) {
            goto fail_absent;
        }
    }
    Py_DECREF(gone);
    Py_DECREF(children);
    f->children = vals;
    f->names = present;
    return 1;
fail_absent:
    Py_XDECREF(present);
    Py_XDECREF(vals);
    Py_XDECREF(gone);
    Py_DECREF(children);
    return -1;
fail:
    Py_CLEAR(f->node);
    if (children != NULL) {
        Py_DECREF(children);
    }
    else {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_XDECREF(v[k]);
        }
    }
    return -1;
}

/* [obj[k] for k in keys[0 .. n)] for an exact dict: a new list, or NULL with
 * the KeyError obj[k] raises. */
static PyObject *
dict_values(PyObject *obj, PyObject **keys, Py_ssize_t n)
{
    PyObject *values = PyList_New(n);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemWithError(obj, keys[i]);
        if (v == NULL) {
            if (!PyErr_Occurred()) {
                PyObject *tup = PyTuple_Pack(1, keys[i]);
                if (tup != NULL) {
                    PyErr_SetObject(PyExc_KeyError, tup);
                    Py_DECREF(tup);
                }
            }
            Py_DECREF(values);
            return NULL;
        }
        Py_INCREF(v);
        PyList_SET_ITEM(values, i, v);
    }
    return values;
}

#define SMALL_DICT 32

/* Before 3.12 a str made by the legacy API may not be ready to read. */
#if PY_VERSION_HEX < 0x030C0000
#define STR_READY(o) PyUnicode_IS_READY(o)
#else
#define STR_READY(o) 1
#endif

/* a < b for two exact str or two exact int keys: never runs user code */
static inline int
key_lt(PyObject *a, PyObject *b, int str)
{
    if (str) {
        if (STR_READY(a) && STR_READY(b) && PyUnicode_KIND(a) == PyUnicode_1BYTE_KIND &&
            PyUnicode_KIND(b) == PyUnicode_1BYTE_KIND) {
            /* code point order is byte order for one-byte strings */
            Py_ssize_t la = PyUnicode_GET_LENGTH(a), lb = PyUnicode_GET_LENGTH(b);
            int r = memcmp(PyUnicode_1BYTE_DATA(a), PyUnicode_1BYTE_DATA(b), la < lb ? la : lb);
            return r < 0 || (r == 0 && la < lb);
        }
        return PyUnicode_Compare(a, b) < 0;
    }
    return PyObject_RichCompareBool(a, b, Py_LT);
}

/* The key orders of the last small dicts met, across calls, by a hash of
 * the first key's address: a dict with the same key objects in the same
 * insertion order (exact str or int, so their order never changes) takes its
 * key order, and its node once one was made, from here instead of sorting
 * again. perm[i] is the sorted position of the i-th key in insertion order.
 * Only classify_small_dict reads or writes an entry; it writes a whole entry
 * at once from its own copies, with no allocation (so no GC, no finalizer,
 * no reentrant call) in between, and lets go of the old references last.
 * The entries hold their keys alive: at most DICT_MEMO * SMALL_DICT. */
#define DICT_MEMO 8
/* misses in a row in one call after which it stops writing entries: a tree of
 * dicts made with fresh key objects never hits, and would pay for nothing */
#define DICT_MEMO_MISSES 8
typedef struct {
    Py_ssize_t n;                /* -1 when unused */
    PyObject *keys[SMALL_DICT];  /* strong: in key order */
    uint8_t perm[SMALL_DICT];
    int permuted;
    PyObject *node; /* strong or NULL: (K_DICT, None, n, keys) once made */
} DictMemo;
static DictMemo dict_memo[DICT_MEMO] = {
    {.n = -1}, {.n = -1}, {.n = -1}, {.n = -1}, {.n = -1}, {.n = -1}, {.n = -1}, {.n = -1},
};

static void
dict_memo_write(DictMemo *m, PyObject *const *ks, Py_ssize_t n, const uint8_t *perm,
                int permuted, PyObject *node)
{
    PyObject *old[SMALL_DICT], *old_node = m->node;
    Py_ssize_t old_n = m->n;
    for (Py_ssize_t i = 0; i < old_n; i++) {
        old[i] = m->keys[i];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        m->keys[i] = Py_NewRef(ks[i]);
        m->perm[i] = perm[i];
    }
    m->n = n;
    m->permuted = permuted;
    m->node = Py_XNewRef(node);
    /* only now: a key or node freed here runs no user code, but keep the
     * entry whole whatever happens */
    for (Py_ssize_t i = 0; i < old_n; i++) {
        Py_DECREF(old[i]);
    }
    Py_XDECREF(old_node);
}

/* A dict whose keys are all exact str or all exact int, with at most
 * SMALL_DICT entries: one pass over it and an insertion sort (or, for keys
 * that dict_memo has, its order). The result is what the general path gives,
 * since nothing here can run user code.
 * Returns 1 done, 0 not such a dict, -1 error. */
static int
classify_small_dict(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    /* keys and values in insertion order (ins, vi), then in key order (ks, vs) */
    PyObject *ks[SMALL_DICT], *vs[SMALL_DICT], *ins[SMALL_DICT], *vi[SMALL_DICT];
    Py_ssize_t n = PyDict_GET_SIZE(obj), pos = 0, i = 0;
    PyObject *k, *v;
    if (n > SMALL_DICT) {
        return 0;
    }
    int str = 1, num = 1;
#if LAYOUT_311
    PyObject **p;
    Py_ssize_t step;
    if (dict_table(obj, &p, &step)) {
        for (; i < n; i++, p += step) {
            k = p[0];
            str &= PyUnicode_CheckExact(k);
            num &= PyLong_CheckExact(k);
            ks[i] = ins[i] = k;
            vs[i] = vi[i] = p[1];
        }
    }
    else
#endif
        while (PyDict_Next(obj, &pos, &k, &v)) {
            str &= PyUnicode_CheckExact(k);
            num &= PyLong_CheckExact(k);
            ks[i] = ins[i] = k;
            vs[i] = vi[i] = v;
            i++;
        }
    if (!(str || num) || i != n) {
        return 0;
    }
    PyObject *tkeys = NULL, *values = NULL, *order = NULL, *memo_node = NULL;
    int permuted = 0, hit = 0, remember = 0;
    uint8_t perm[SMALL_DICT];
    DictMemo *m = &dict_memo[n ? (((size_t)ins[0] >> 4) ^ (size_t)n) % DICT_MEMO : 0];
    f->node = NULL;
    if (m->n == n) {
        for (i = 0; i < n && m->keys[m->perm[i]] == ins[i]; i++) {
        }
        hit = i == n;
    }
    if (hit) {
        /* the memo's keys, in the memo's insertion order: its order serves
         * (ks and vs are in key order already when the keys were inserted so) */
        permuted = m->permuted;
        if (permuted) {
            for (i = 0; i < n; i++) {
                ks[m->perm[i]] = ins[i];
                vs[m->perm[i]] = vi[i];
            }
        }
        memo_node = m->node;
        if (memo_node == NULL) { /* a node made below is written back with it */
            memcpy(perm, m->perm, (size_t)n);
        }
        c->dict_misses = 0;
    }
    else {
        /* insertion sort; at[j] is where the j-th key in key order was
         * inserted, kept while this call may still write the memo */
        uint8_t at[SMALL_DICT];
        remember = c->dict_misses < DICT_MEMO_MISSES;
        c->dict_misses += remember; /* stops at DICT_MEMO_MISSES */
        for (i = 0; i < n; i++) {
            at[i] = (uint8_t)i;
        }
        for (Py_ssize_t a = 1; a < n; a++) {
            PyObject *kk = ks[a], *vv = vs[a];
            Py_ssize_t b = a;
            while (b > 0 && key_lt(kk, ks[b - 1], str)) {
                ks[b] = ks[b - 1];
                vs[b] = vs[b - 1];
                at[b] = at[b - 1];
                b--;
            }
            if (b != a) {
                permuted = 1;
                ks[b] = kk;
                vs[b] = vv;
                at[b] = (uint8_t)a;
            }
        }
        if (remember) {
            for (i = 0; i < n; i++) {
                perm[at[i]] = (uint8_t)i;
            }
        }
        if (m->n == n && m->node != NULL) {
            /* the memo's keys in another insertion order: its node serves */
            for (i = 0; i < n && m->keys[i] == ks[i]; i++) {
            }
            if (i == n) {
                memo_node = m->node;
            }
        }
    }
    if (memo_node != NULL) {
        tkeys = Py_NewRef(PyTuple_GET_ITEM(memo_node, 3));
        f->node = Py_NewRef(memo_node);
    }
    f->direct_n = 0;
    if (c->is_leaf == NULL && c->mode != 2 && n > 0) {
        for (i = 0; i < n && known_leaf(c, Py_TYPE(vs[i])); i++) {
        }
        int held = i == n ? stack_holds(s, obj) : 1;
        if (held < 0) {
            goto fail;
        }
        if (!held) {
            memcpy(f->direct, vs, n * sizeof(PyObject *));
            f->direct_n = n;
        }
    }
    /* leaves only, and no child to visit: no names are needed */
    int no_names = tkeys == NULL && f->direct_n && !c->mode;
    if (no_names) {
        tkeys = Py_NewRef(empty_tuple);
    }
    if (tkeys == NULL && (tkeys = seq_of(0, ks, n)) == NULL) {
        goto fail;
    }
    if (f->direct_n) {
        Py_INCREF(empty_tuple);
        values = empty_tuple;
    }
    else if ((values = seq_of(0, vs, n)) == NULL) {
        goto fail;
    }
    if (c->mode) {
        if (permuted && (order = seq_of(0, ins, n)) == NULL) {
            goto fail;
        }
    }
    int made = 0;
    if (f->node == NULL && !no_names) {
        /* made in every mode that names the keys: the memo keeps it */
        f->node = make_node(K_DICT, Py_None, n, tkeys);
        if (f->node == NULL) {
            goto fail;
        }
        made = 1;
    }
    if (remember || (made && hit)) {
        /* after the last allocation, from this call's own copies */
        dict_memo_write(m, ks, n, perm, permuted, f->node);
    }
    if (!c->mode) {
        Py_CLEAR(f->node);
    }
    f->order = order;
    f->order_known = 1;
    f->children = values;
    f->names = tkeys;
    f->keymode = KM_MAP;
    f->live = 0;
    f->dict_kind = 1;
    return 1;
fail:
    Py_XDECREF(f->node);
    f->node = NULL;
    Py_XDECREF(tkeys);
    Py_XDECREF(values);
    Py_XDECREF(order);
    return -1;
}

static int
classify_dict(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    int r = classify_small_dict(c, s, obj, f);
    if (r != 0) {
        return r;
    }
    if (stack_freeze(s) < 0) {
        return -1;
    }
    PyObject *keys = PyDict_Keys(obj);
    if (keys == NULL) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n > 1) {
        /* sorted(keys); keys that are not mutually orderable keep insertion order */
        PyObject *sorted = PyList_GetSlice(keys, 0, n);
        if (sorted == NULL) {
            Py_DECREF(keys);
            return -1;
        }
        if (PyList_Sort(sorted) < 0) {
            Py_DECREF(sorted);
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(keys);
                return -1;
            }
            PyErr_Clear();
        }
        else {
            Py_SETREF(keys, sorted);
        }
    }
    n = PyList_GET_SIZE(keys);
    PyObject *values = dict_values(obj, ((PyListObject *)keys)->ob_item, n);
    if (values == NULL) {
        Py_DECREF(keys);
        return -1;
    }
    PyObject *tkeys = PyList_AsTuple(keys);
    Py_DECREF(keys);
    if (tkeys == NULL) {
        Py_DECREF(values);
        return -1;
    }
    f->node = NULL;
    if (c->mode) {
        f->node = make_node(K_DICT, Py_None, n, tkeys);
        if (f->node == NULL) {
            Py_DECREF(tkeys);
            Py_DECREF(values);
            return -1;
        }
    }
    f->children = values;
    f->names = tkeys;
    f->keymode = KM_MAP;
    f->live = 0;
    f->dict_kind = 1;
    return 1;
}

/* Returns 0 for a leaf, 1 for a container (f filled), -1 on error. */
static int
classify(Ctx *c, Stack *s, PyObject *obj, Found *f)
{
    PyTypeObject *t = Py_TYPE(obj);
    int want_node = c->mode != 0;
    if (c->rules != NULL) {
        if (stack_freeze(s) < 0) {
            return -1;
        }
        PyObject *rule = PyDict_GetItemWithError(c->rules, (PyObject *)t);
        if (rule == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (rule != NULL) {
            Py_INCREF(rule);
            PyObject *fn = PyObject_GetAttr(rule, s_flatten);
            PyObject *res = fn ? PyObject_CallOneArg(fn, obj) : NULL;
            Py_XDECREF(fn);
            int r = res ? user_node(c, s, res, t, rule, f) : -1;
            Py_XDECREF(res);
            Py_DECREF(rule);
            return r;
        }
    }
    if (t == &PyTuple_Type) {
        f->node = want_node ? seq_node(c, K_TUPLE, PyTuple_GET_SIZE(obj)) : NULL;
        if (want_node && f->node == NULL) {
            return -1;
        }
        Py_INCREF(obj);
        f->children = obj;
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    if (t == &PyList_Type) {
        f->node = want_node ? seq_node(c, K_LIST, PyList_GET_SIZE(obj)) : NULL;
        if (want_node && f->node == NULL) {
            return -1;
        }
        if (c->is_leaf != NULL) {
            f->children = PyList_AsTuple(obj);
            if (f->children == NULL) {
                Py_XDECREF(f->node);
                return -1;
            }
            f->live = 0;
        }
        else {
            Py_INCREF(obj);
            f->children = obj;
            f->live = 1;
        }
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->dict_kind = 0;
        return 1;
    }
    if (t == &PyDict_Type) {
        return classify_dict(c, s, obj, f);
    }
    if (obj == Py_None) {
        f->node = want_node ? (Py_INCREF(NONE_NODE), NONE_NODE) : NULL;
        Py_INCREF(empty_tuple);
        f->children = empty_tuple;
        f->names = NULL;
        f->keymode = KM_SEQ;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    /* Lists being read are copied (stack_freeze) before anything that could
     * run user code: making a class's plan could, a remembered plan cannot; a
     * leaf runs none, nor does a record whose fields have fast reads
     * (record_fields copies them before any getattr). */
    TypeEntry *e = tc_find(&c->types, t);
    if (e == NULL) {
        for (int i = 0; i < 6; i++) {
            if (t == atom_types[i] && c->atom_leaf[i]) {
                return 0;
            }
        }
        if ((e = tc_add(&c->types, t)) == NULL) {
            return -1;
        }
        if (!plan_saved(e) && (stack_freeze(s) < 0 || plan_made(e) < 0)) {
            return -1;
        }
    }
    else if (e->plan != PLAN_LEAF && !entry_fresh(e) &&
             (stack_freeze(s) < 0 || entry_refresh(e) < 0)) {
        return -1;
    }
    if (e->plan != PLAN_LEAF &&
        !(e->reads != NULL && (e->plan == PLAN_DATACLASS || e->plan == PLAN_ATTRS)) &&
        stack_freeze(s) < 0) {
        return -1;
    }
    switch (e->plan) {
    case PLAN_LEAF:
        c->last_leaf = t;
        return 0;
    case PLAN_TUPLE_LEAF:
        return 0;
    case PLAN_NAMEDTUPLE: {
        PyObject *fields = e->info;
        if (PyTuple_GET_SIZE(fields) != PyTuple_GET_SIZE(obj)) {
            return 0;
        }
        f->node = want_node ? make_node(K_NAMEDTUPLE, (PyObject *)t, PyTuple_GET_SIZE(obj), fields)
                            : NULL;
        if (want_node && f->node == NULL) {
            return -1;
        }
        Py_INCREF(obj);
        f->children = obj;
        Py_INCREF(fields);
        f->names = fields;
        f->keymode = KM_ATTR;
        f->live = 0;
        f->dict_kind = 0;
        return 1;
    }
    case PLAN_DATACLASS:
    case PLAN_ATTRS: {
        int r = record_fields(c, s, obj, e, e->plan == PLAN_DATACLASS ? K_DATACLASS : K_ATTRS, f,
                              want_node);
        if (r != 2) {
            return r;
        }
        break;
    }
    case PLAN_CUSTOM: {
        PyObject *res = PyObject_CallMethodNoArgs(obj, s_tree_flatten);
        int r = res ? user_node(c, s, res, t, NULL, f) : -1;
        Py_XDECREF(res);
        return r;
    }
    default:
        break;
    }
    if (stack_freeze(s) < 0) { /* not done above for a record */
        return -1;
    }
    int r = classify_python(c, s, obj, f);
    if (r == 0 && e->plan == PLAN_PYTHON && !PyTuple_Check(obj)) {
        /* the pure engine remembers leaf types for the rest of the call */
        e->plan = PLAN_LEAF;
        Py_CLEAR(e->info);
        Py_CLEAR(e->reads_obj);
        e->reads = NULL;
    }
    return r;
}

/* The insertion order of a dict node, when it differs from its leaf order;
 * new reference to it, or to None. */
static PyObject *
dict_order(PyObject *node, PyObject *obj, PyObject *names)
{
    if (PyDict_CheckExact(obj) && PyTuple_CheckExact(names) &&
        PyDict_GET_SIZE(obj) == PyTuple_GET_SIZE(names)) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        int same = 1;
#if LAYOUT_311
        PyObject **p;
        Py_ssize_t step;
        if (dict_table(obj, &p, &step)) {
            for (Py_ssize_t n = PyDict_GET_SIZE(obj); same && i < n; i++, p += step) {
                same = p[0] == PyTuple_GET_ITEM(names, i);
            }
        }
        else
#endif
            while (PyDict_Next(obj, &pos, &k, &v)) {
                if (k != PyTuple_GET_ITEM(names, i++)) {
                    same = 0;
                    break;
                }
            }
        if (same) {
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallFunctionObjArgs(py_dict_order_differs, node, obj, NULL);
}

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
        for (Py_ssize_t j = 0; j < k; j++) {
            o[j] = LEAF_NODE;
        }
        nodes->n += k;
#if defined(Py_REF_DEBUG) || defined(Py_GIL_DISABLED)
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_INCREF(LEAF_NODE);
        }
#else
        /* one add, not a chain of k dependent ones on a single count */
        Py_SET_REFCNT(LEAF_NODE, Py_REFCNT(LEAF_NODE) + k);
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
    PyObject *paths;  /* strong or NULL: mode 2's paths */
    PyObject *obj;    /* strong or NULL: the next value to classify */
    int mode;         /* 0 leaves, 1 and spec, 2 and paths */
} Walk;

static int
walk_init(Walk *w, PyObject *tree, PyObject *is_leaf, PyObject *rules, int mode)
{
    stack_init(&w->s);
    vec_init(&w->nodes);
    vec_init(&w->keys);
    vec_init(&w->leaves);
    w->orders = w->paths = w->obj = NULL;
    w->mode = mode;
    if (ctx_init(&w->c, is_leaf, rules, mode) < 0) {
        return -1;
    }
    if (mode == 2 && (w->paths = PyList_New(0)) == NULL) {
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

/* Walk from w->obj on in pre-order, appending to w's leaves (and nodes,
 * orders and paths by its mode). Returns 0 once the tree is done, -1 on
 * error, and, when lazy, 1 as soon as a leaf is ready, with w->obj the next
 * value to classify. Inlined into each caller, so walk()'s copy has lazy
 * constant 0 and its loop is as it was before there was a lazy one. */
static PK_ALWAYS_INLINE int
walk_run(Walk *w, const int lazy)
{
    Ctx *const c = &w->c;
    Stack *const s = &w->s;
    Vec *const nodes = &w->nodes, *const keys = &w->keys, *const leaves = &w->leaves;
    const int mode = w->mode;
    PyObject *obj = w->obj;
    w->obj = NULL;
    for (;;) {
        if (lazy && leaves->n) {
            /* a leaf is ready: return it before anything that can run user
             * code; the caller's code runs next, so the lists still being
             * read are copied now, as they are (stack_freeze) */
            w->obj = obj;
            return stack_freeze(s) < 0 ? -1 : 1;
        }
        int r;
        Found f;
        f.order = NULL;
        f.order_known = 0;
        f.direct_n = 0;
        f.direct_owned = 0;
        if (c->is_leaf != NULL) {
            PyObject *v = PyObject_CallOneArg(c->is_leaf, obj);
            if (v == NULL) {
                goto error;
            }
            r = PyObject_IsTrue(v);
            Py_DECREF(v);
            if (r < 0) {
                goto error;
            }
            r = r ? 0 : classify(c, s, obj, &f);
        }
        else if (known_leaf(c, Py_TYPE(obj))) {
            r = 0;
        }
        else {
            r = classify(c, s, obj, &f);
        }
        if (r < 0) {
            goto error;
        }
        if (r == 0) {
            if (emit_leaf(leaves, nodes, mode, obj) < 0) {
                goto error;
            }
            if (mode == 2) {
                PyObject *p = seq_of(0, keys->v, keys->n);
                if (p == NULL || PyList_Append(w->paths, p) < 0) {
                    Py_XDECREF(p);
                    goto error;
                }
                Py_DECREF(p);
            }
        }
        else {
            if (mode) {
                if (f.dict_kind) {
                    PyObject *order = f.order;
                    f.order = NULL;
                    if (order == NULL) {
                        order = f.order_known ? (Py_INCREF(Py_None), Py_None)
                              : stack_freeze(s) < 0 ? NULL
                                                     : dict_order(f.node, obj, f.names);
                    }
                    if (order == NULL) {
                        goto found_error;
                    }
                    if (order != Py_None) {
                        if (w->orders == NULL && (w->orders = PyList_New(0)) == NULL) {
                            Py_DECREF(order);
                            goto found_error;
                        }
                        PyObject *pair = Py_BuildValue("(nN)", nodes->n, order);
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
                while (i < f.direct_n && emit_leaf(leaves, nodes, mode, f.direct[i]) == 0) {
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
        while (s->n) {
            Frame *fr = &s->v[s->n - 1];
            if (fr->pos < fr->n) {
                if (frame_check(fr) < 0) {
                    goto error;
                }
                if (mode != 2 && c->is_leaf == NULL &&
                    known_leaf(c, Py_TYPE(frame_item(fr, fr->pos)))) {
                    /* A run of children that are leaves by their type: no user code
                     * runs, so they are copied in one go. The room reserved is at
                     * most what this frame's own children take. */
                    if (fr->n - fr->pos == 1) {
                        /* the last child (as in [tree, leaf]): no run to copy */
                        if (emit_leaf(leaves, nodes, mode, frame_item(fr, fr->pos)) < 0) {
                            goto error;
                        }
                        fr->pos++;
                    }
                    else if (leaf_run_out(c, fr, leaves, mode ? nodes : NULL) < 0) {
                        goto error;
                    }
                    if (fr->pos == fr->n) {
                        continue;
                    }
                }
                if (frame_check(fr) < 0) {
                    goto error;
                }
                Py_ssize_t i = fr->pos++;
                obj = frame_item(fr, i);
                Py_INCREF(obj);
                if (mode == 2) {
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
            stack_pop(s);
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
    const int mode = w->mode;
    PyObject *result = NULL;
    if (!mode) {
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
        if (mode == 2) {
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
walk(PyObject *tree, PyObject *is_leaf, PyObject *rules, int mode)
{
    Walk w;
    PyObject *result = NULL;
    if (walk_init(&w, tree, is_leaf, rules, mode) == 0 && walk_run(&w, 0) == 0) {
        result = walk_result(&w);
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
} LeafIter;

enum { LI_WALKING, LI_RUNNING, LI_DONE };

static PyTypeObject LeafIter_Type;

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
    int r = walk_run(w, 1);
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
    leafiter_release(it);
    PyObject_GC_Del(it);
}

static PyTypeObject LeafIter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pytree_kit._speedups.LeafIter",
    .tp_basicsize = sizeof(LeafIter),
    .tp_dealloc = (destructor)leafiter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The leaves of a tree, in order, found as they are asked for.",
    .tp_traverse = (traverseproc)leafiter_traverse,
    .tp_clear = (inquiry)leafiter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)leafiter_next,
};

/* iter_leaves(tree, is_leaf=None, rules=None): a LeafIter; nothing is read
 * until the first next */
static PyObject *
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
    it->is_leaf = is_leaf == Py_None ? NULL : Py_NewRef(is_leaf);
    it->rules = rules == Py_None ? NULL : Py_NewRef(rules);
    it->next = 0;
    it->state = LI_WALKING;
    if (walk_init(&it->w, args[0], is_leaf, rules, 0) < 0) {
        Py_DECREF(it);
        return NULL;
    }
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

/* fname(tree, is_leaf=None, rules=None): walk in the given mode */
static PyObject *
walk_call(PyObject *const *args, Py_ssize_t nargs, const char *fname, int mode)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s(tree, is_leaf=None, rules=None) takes 1 to 3 arguments",
                     fname);
        return NULL;
    }
    return walk(args[0], nargs > 1 ? args[1] : Py_None, nargs > 2 ? args[2] : Py_None, mode);
}

static PyObject *
sp_flatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return walk_call(args, nargs, "flatten", 1);
}

static PyObject *
sp_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return walk_call(args, nargs, "leaves", 0);
}

static PyObject *
sp_flatten_with_path(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return walk_call(args, nargs, "flatten_with_path", 2);
}

/* the entry points FastCall calls (_speedups.h) */
PyObject *
pk_walk(PyObject *tree, PyObject *is_leaf, PyObject *rules, int mode)
{
    return walk(tree, is_leaf, rules, mode);
}

/* ------------------------------------------------------------------------ */
/* unflatten */

static int
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

/* set on import by int_digits_check, where compiled */
static int int_digits_ok;

/* The value of an exact int known to be small and non-negative, read
 * without a call when the representation allows; -1 (maybe with an error
 * set) otherwise. */
static inline Py_ssize_t
small_long(PyObject *o)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#elif INT_DIGITS
    /* up to 3.11: the sign and number of digits in ob_size, then the digits */
    if (int_digits_ok) {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) {
            return 0;
        }
        if (size == 1) {
            return (Py_ssize_t)((PyLongObject *)o)->ob_digit[0];
        }
    }
#endif
    return PyLong_AsSsize_t(o);
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

static inline int
node_parts(PyObject *node, int *kind, Py_ssize_t *arity)
{
    if (node == LEAF_NODE) {
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

static int
is_plain_tuple_subtype(PyObject *t)
{
    if (!PyType_Check(t) || !PyType_IsSubtype((PyTypeObject *)t, &PyTuple_Type)) {
        return 0;
    }
    PyTypeObject *b = (PyTypeObject *)t;
    while (b != NULL && PyType_HasFeature(b, Py_TPFLAGS_HEAPTYPE)) {
        b = b->tp_base;
    }
    return b == &PyTuple_Type;
}

/* t.__new__(t), as the pure engine calls it. When t's metaclass is type and
 * t.__new__ is object.__new__ itself (found in t's MRO with no Python code
 * run), that call is object.__new__(t), whose safety check passes because
 * t->tp_new is object's: so object's tp_new is called at once, with no bound
 * lookup, argument tuple or wrapper. New reference. */
static PyObject *
new_instance(PyObject *t)
{
    if (Py_TYPE(t) == &PyType_Type && ((PyTypeObject *)t)->tp_new == PyBaseObject_Type.tp_new &&
        _PyType_Lookup((PyTypeObject *)t, s_new) == object_new_fn) {
        return PyBaseObject_Type.tp_new((PyTypeObject *)t, empty_tuple, NULL);
    }
    PyObject *newf = PyObject_GetAttr(t, s_new);
    if (newf == NULL) {
        return NULL;
    }
    PyObject *obj = PyObject_CallOneArg(newf, t);
    Py_DECREF(newf);
    return obj;
}

/* object.__setattr__ on instances of t is plain generic setattr */
static int
generic_setattr_ok(PyObject *t)
{
    if (!PyType_Check(t)) {
        return 0;
    }
    PyObject *mro = ((PyTypeObject *)t)->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (!PyType_HasFeature(b, Py_TPFLAGS_HEAPTYPE) && b->tp_setattro != PyObject_GenericSetAttr) {
            return 0;
        }
    }
    return 1;
}

/* {keys[i]: vals[i * step]} for i in 0 .. n, inserted in key order: a dict
 * node with no insertion order of its own. step is 1 for children in leaf
 * order, -1 for children read down the value stack. New reference. */
static inline PyObject *
dict_in_key_order(PyObject *keys, PyObject *const *vals, Py_ssize_t n, Py_ssize_t step)
{
    PyObject *m = PyDict_New();
    if (m == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(m, PyTuple_GET_ITEM(keys, i), vals[i * step]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}

/* Dicts of the same keys, many times over (unflatten)
 *
 * A dict of n keys costs PyDict_New and n PyDict_SetItem calls, each hashing
 * and probing; that is most of unflatten's time on trees of small dicts. On
 * CPython 3.11, when a node's keys come again in one call, a template is made
 * ({k: None} in key order, never shown to anyone), and each further dict of
 * those keys gets a copy of the template's table in one block, with its keys'
 * counts raised and the values put in its entries, in place of the empty
 * table of a new dict (as PyDict_Copy does, less the values it would copy and
 * then drop). Only keys that are exact str or int are taken (no user code runs
 * for their hash or equality), and a template whose table is not the plain
 * one expected (its keys in order, no holes) is not used. The result is
 * tracked by the GC exactly when inserting the values would have tracked it. */

#define TEMPLATES 8

typedef struct {
    PyObject *keys; /* borrowed: the spec holds it for the call */
    PyObject *dict; /* strong, the template; NULL until the keys come again */
    size_t size;    /* of the template's table, in bytes */
    int unusable;   /* keys that no template serves */
} Template;

typedef struct {
    unsigned int used; /* bit i: v[i] is set; nothing else needs setting up */
    Template v[TEMPLATES];
} Templates;

static PK_NO_INLINE void
templates_clear(Templates *t)
{
    for (int i = 0; i < TEMPLATES; i++) {
        if (t->used & (1u << i)) {
            Py_CLEAR(t->v[i].dict);
        }
    }
    t->used = 0;
}

#if LAYOUT_311
/* Make e's template for keys (n of them): 0, with e->unusable set when these
 * keys cannot have one; -1 on error. */
static int
template_make(Template *e, PyObject *keys, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!(PyUnicode_CheckExact(k) || PyLong_CheckExact(k))) {
            e->unusable = 1;
            return 0;
        }
    }
    PyObject *none = Py_None;
    if ((e->dict = dict_in_key_order(keys, &none, n, 0)) == NULL) {
        return -1;
    }
    PyDictObject *mp = (PyDictObject *)e->dict;
    Keys311 *k = (Keys311 *)mp->ma_keys;
    e->unusable = 1;
    /* a key given twice, a split or holed table, another kind of table */
    if (mp->ma_values != NULL || mp->ma_used != n || k->dk_nentries != n || k->dk_kind > 1 ||
        k->dk_refcnt != 1 || PyObject_GC_IsTracked(e->dict)) {
        return 0;
    }
    Py_ssize_t step = k->dk_kind == 1 ? 2 : 3;
    PyObject **p = (PyObject **)ENTRIES311(k) + (step - 2);
    for (Py_ssize_t i = 0; i < n; i++, p += step) {
        if (p[0] != PyTuple_GET_ITEM(keys, i) || p[1] != Py_None) {
            return 0;
        }
    }
    /* _PyDict_KeysSize: the header, the indices, then 2/3 of the slots as entries */
    e->size = sizeof(Keys311) + ((size_t)1 << k->dk_log2_index_bytes) +
              ((((size_t)1 << k->dk_log2_size) << 1) / 3) * (size_t)step * sizeof(PyObject *);
    e->unusable = 0;
    return 0;
}

/* A new dict with the template's table and vals[i * step] as the value of its
 * i-th key: in *out, 1, the references in vals now the dict's; 0 when a new
 * dict is not laid out as expected (nothing made); -1 on error. */
static int
dict_from_template(Template *e, PyObject *const *vals, Py_ssize_t n, Py_ssize_t step,
                   PyObject **out)
{
    Keys311 *tk = (Keys311 *)((PyDictObject *)e->dict)->ma_keys;
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return -1;
    }
    PyDictObject *mp = (PyDictObject *)d;
    Keys311 *empty = (Keys311 *)mp->ma_keys; /* untracked: checked on import */
    if (mp->ma_used != 0 || mp->ma_values != NULL || empty->dk_nentries != 0 ||
        empty->dk_refcnt < 2) {
        Py_DECREF(d);
        return 0;
    }
    Keys311 *k = PyObject_Malloc(e->size);
    if (k == NULL) {
        Py_DECREF(d);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(k, tk, e->size);
    k->dk_refcnt = 1;
    k->dk_version = 0;
    Py_ssize_t es = tk->dk_kind == 1 ? 2 : 3; /* pointers per entry */
    PyObject **p = (PyObject **)ENTRIES311(k) + (es - 2);
    int track = 0;
    for (Py_ssize_t i = 0; i < n; i++, p += es) {
        PyObject *v = vals[i * step];
        Py_INCREF(p[0]); /* the key */
        p[1] = v; /* in place of the template's None, whose count was not raised */
        /* as dict insertion decides it (MAINTAIN_TRACKING) */
        track = track || (PyType_IS_GC(Py_TYPE(v)) &&
                          (Py_TYPE(v)->tp_is_gc == NULL || Py_TYPE(v)->tp_is_gc(v)) &&
                          (!PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v)));
    }
    /* the new dict's empty table is the shared one, never freed: give its
     * reference back as dictkeys_decref would */
    empty->dk_refcnt--;
    mp->ma_keys = (PyDictKeysObject *)k;
    mp->ma_used = n;
    if (track) {
        PyObject_GC_Track(d);
    }
    *out = d;
    return 1;
}
#endif

/* dict(zip(keys, vals[0], vals[step], ...)) inserted in key order, from a
 * template when these keys were met before in this call: a new reference, the
 * references in vals now the dict's; or NULL on error, vals untouched. */
static PK_NO_INLINE PyObject *
dict_of(Templates *t, PyObject *keys, PyObject *const *vals, Py_ssize_t n, Py_ssize_t step)
{
    PyObject *d;
#if LAYOUT_311
    if (dict_layout_ok && n > 0) {
        size_t slot = ((size_t)keys >> 4) % TEMPLATES;
        Template *e = &t->v[slot];
        if (!(t->used & (1u << slot))) {
            t->used |= 1u << slot;
            e->keys = keys;
            e->dict = NULL;
            e->unusable = 0;
            goto insert;
        }
        int same = e->keys == keys;
        if (!same && PyTuple_GET_SIZE(e->keys) == n) {
            same = 1;
            for (Py_ssize_t i = 0; same && i < n; i++) {
                same = PyTuple_GET_ITEM(e->keys, i) == PyTuple_GET_ITEM(keys, i);
            }
        }
        if (!same) {
            Py_CLEAR(e->dict);
            e->keys = keys;
            e->unusable = 0;
        }
        else if (!e->unusable) {
            if (e->dict == NULL && template_make(e, keys, n) < 0) {
                return NULL;
            }
            if (!e->unusable) {
                int r = dict_from_template(e, vals, n, step, &d);
                if (r != 0) {
                    return r < 0 ? NULL : d;
                }
                e->unusable = 1;
            }
        }
    }
insert:
#else
    (void)t;
#endif
    if ((d = dict_in_key_order(keys, vals, n, step)) != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_DECREF(vals[i * step]);
        }
    }
    return d;
}

/* The dict of a dict node with an insertion order, built in that order at
 * once, when the order is a permutation of the node's keys (the same
 * objects, exact str or int, as flatten gives): what building the dict in
 * key order and then re-inserting its items in the given order gives.
 * New reference; None when the general path must do it. */
static PyObject *
ordered_dict(PyObject *keys, PyObject **ch, Py_ssize_t arity, PyObject *order)
{
    if (!PyTuple_CheckExact(order) || PyTuple_GET_SIZE(order) != arity || arity > 64) {
        Py_RETURN_NONE;
    }
    PyObject *r = PyDict_New();
    if (r == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < arity; i++) {
        PyObject *k = PyTuple_GET_ITEM(order, i);
        Py_ssize_t j = arity - 1;
        while (j >= 0 && PyTuple_GET_ITEM(keys, j) != k) {
            j--;
        }
        if (j < 0 || !(PyUnicode_CheckExact(k) || PyLong_CheckExact(k))) {
            Py_DECREF(r);
            Py_RETURN_NONE;
        }
        if (PyDict_SetItem(r, k, ch[j]) < 0) {
            Py_DECREF(r);
            return NULL;
        }
    }
    if (PyDict_GET_SIZE(r) != arity) {
        /* a key given twice: not a permutation */
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    return r;
}

/* Build one node from children ch[0..arity) (in leaf order). New reference. */
static PyObject *
build(int kind, PyObject *node, PyObject **ch, Py_ssize_t arity, PyObject *order)
{
    PyObject *t = PyTuple_GET_ITEM(node, 1);
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    /* tuples and lists are built by sp_unflatten itself */
    switch (kind) {
    case K_NONE:
        if (arity == 0) {
            Py_RETURN_NONE;
        }
        break;
    case K_DICT:
        if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == arity) {
            PyObject *r;
            if (order != NULL) {
                r = ordered_dict(aux, ch, arity, order);
                if (r != Py_None) {
                    return r;
                }
                Py_DECREF(r);
            }
            PyObject *m = dict_in_key_order(aux, ch, arity, 1);
            if (m == NULL || order == NULL) {
                return m;
            }
            PyObject *seq = PySequence_Fast(order, "a dict order must be a sequence");
            r = seq ? PyDict_New() : NULL;
            if (r == NULL) {
                Py_XDECREF(seq);
                Py_DECREF(m);
                return NULL;
            }
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
                PyObject *k = PySequence_Fast_GET_ITEM(seq, i);
                PyObject *v = PyObject_GetItem(m, k);
                if (v == NULL || PyDict_SetItem(r, k, v) < 0) {
                    Py_XDECREF(v);
                    Py_DECREF(r);
                    Py_DECREF(seq);
                    Py_DECREF(m);
                    return NULL;
                }
                Py_DECREF(v);
            }
            Py_DECREF(seq);
            Py_DECREF(m);
            return r;
        }
        break;
    case K_NAMEDTUPLE:
        if (is_plain_tuple_subtype(t)) {
            PyObject *tup = seq_of(0, ch, arity);
            if (tup == NULL) {
                return NULL;
            }
            PyObject *args = PyTuple_Pack(1, tup);
            Py_DECREF(tup);
            if (args == NULL) {
                return NULL;
            }
            PyObject *r = PyTuple_Type.tp_new((PyTypeObject *)t, args, NULL);
            Py_DECREF(args);
            return r;
        }
        break;
    case K_DATACLASS:
    case K_ATTRS:
        if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == 4 &&
            PyTuple_GET_ITEM(aux, 3) == Py_None && PyTuple_CheckExact(PyTuple_GET_ITEM(aux, 0)) &&
            PyTuple_CheckExact(PyTuple_GET_ITEM(aux, 1)) && generic_setattr_ok(t)) {
            PyObject *names = PyTuple_GET_ITEM(aux, 0);
            PyObject *statics = PyTuple_GET_ITEM(aux, 1);
            PyObject *obj = new_instance(t);
            if (obj == NULL) {
                return NULL;
            }
            Py_ssize_t n = PyTuple_GET_SIZE(names);
            if (n > arity) {
                n = arity;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                if (PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(names, i), ch[i]) < 0) {
                    Py_DECREF(obj);
                    return NULL;
                }
            }
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(statics); i++) {
                PyObject *pr = PyTuple_GET_ITEM(statics, i);
                if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 2) {
                    Py_DECREF(obj);
                    PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: bad static field");
                    return NULL;
                }
                if (PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(pr, 0), PyTuple_GET_ITEM(pr, 1)) <
                    0) {
                    Py_DECREF(obj);
                    return NULL;
                }
            }
            return obj;
        }
        break;
    case K_CUSTOM:
        /* (aux, None) or optree's (aux, None, entries): children as a tuple */
        if (PyTuple_CheckExact(aux) &&
            (PyTuple_GET_SIZE(aux) == 2 || PyTuple_GET_SIZE(aux) == 3) &&
            PyTuple_GET_ITEM(aux, 1) == Py_None) {
            PyObject *tup = seq_of(0, ch, arity);
            if (tup == NULL) {
                return NULL;
            }
            PyObject *r = PyObject_CallMethodObjArgs(t, s_tree_unflatten, PyTuple_GET_ITEM(aux, 0),
                                                     tup, NULL);
            Py_DECREF(tup);
            return r;
        }
        break;
    default:
        break;
    }
    /* _pure.build(kind, t, aux, children, order) */
    PyObject *lst = seq_of(1, ch, arity);
    if (lst == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(py_build, PyTuple_GET_ITEM(node, 0), t, aux, lst,
                                               order ? order : Py_None, NULL);
    Py_DECREF(lst);
    return r;
}


/* The leaves as a new reference to a list or tuple, read as _pure._read_leaves
 * reads them: a sized iterable whole, an iterator up to one leaf past n. */
static PyObject *
read_leaves(PyObject *leaves, Py_ssize_t n)
{
    if (PyList_CheckExact(leaves) || PyTuple_CheckExact(leaves)) {
        Py_INCREF(leaves);
        return leaves;
    }
    PyObject *len = PyObject_GetAttr((PyObject *)Py_TYPE(leaves), s_len);
    if (len != NULL) {
        Py_DECREF(len);
        return PySequence_List(leaves);
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return NULL;
    }
    PyErr_Clear();
    PyObject *it = PyObject_GetIter(leaves);
    if (it == NULL) {
        return NULL;
    }
    PyObject *got = PyList_New(0);
    while (got != NULL && PyList_GET_SIZE(got) <= n) {
        PyObject *x = PyIter_Next(it);
        if (x == NULL) {
            if (PyErr_Occurred()) {
                Py_CLEAR(got);
            }
            break;
        }
        int r = PyList_Append(got, x);
        Py_DECREF(x);
        if (r < 0) {
            Py_CLEAR(got);
        }
    }
    Py_DECREF(it);
    if (got != NULL && PyList_GET_SIZE(got) > n) {
        PyErr_Format(PyExc_ValueError, "unflatten: the spec has %zd %s, but more than %zd were given",
                     n, n == 1 ? "leaf" : "leaves", n);
        Py_CLEAR(got);
    }
    return got;
}

/* The node index of orders[i], a pair checked to start with an exact int
 * that fits. Not inlined: the unflatten loop is short of registers. */
PK_NO_INLINE static Py_ssize_t
order_index(PyObject *orders, Py_ssize_t i)
{
    return small_long(PyTuple_GET_ITEM(PyTuple_GET_ITEM(orders, i), 0));
}

/* specs of fewer nodes keep unflatten's value stack on the C stack (2 KiB) */
#define UNFLATTEN_INLINE 128

static PyObject *
sp_unflatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unflatten(spec, leaves) takes 2 arguments");
        return NULL;
    }
    PyObject *spec = args[0], *leaves = args[1];
    PyObject *nodes, *orders, *order_map = NULL, *result = NULL;
    Py_ssize_t n;
    if (spec_parts(spec, &nodes, &orders, &n) < 0) {
        return NULL;
    }
    Py_INCREF(nodes);
    Py_INCREF(orders);
    if ((leaves = read_leaves(leaves, n)) == NULL) {
        Py_DECREF(nodes);
        Py_DECREF(orders);
        return NULL;
    }
    /* Read as the pure engine reads it: leaves[i], checked each time, since a
     * callback (__tree_unflatten__, a rule) may change the caller's list. */
    PyObject *seq = leaves;
    int is_list = PyList_CheckExact(seq);
    Py_ssize_t given = Py_SIZE(seq);
    if (given != n) {
        PyErr_Format(PyExc_ValueError, "unflatten: the spec has %zd %s, but %zd %s given", n,
                     n == 1 ? "leaf" : "leaves", given, given == 1 ? "was" : "were");
        Py_DECREF(seq);
        Py_DECREF(nodes);
        Py_DECREF(orders);
        return NULL;
    }
    /* The orders as flatten makes them: (node index, order) pairs with exact
     * int indexes, strictly ascending. Read from the end as the nodes are.
     * Anything else is looked up through a dict, as the pure engine does. */
    Py_ssize_t no = PyTuple_GET_SIZE(orders), oi = no - 1, prev = -1;
    for (Py_ssize_t i = 0; i < no; i++) {
        PyObject *pr = PyTuple_GET_ITEM(orders, i);
        Py_ssize_t at;
        if (!PyTuple_CheckExact(pr) || PyTuple_GET_SIZE(pr) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(pr, 0)) ||
            (at = PyLong_AsSsize_t(PyTuple_GET_ITEM(pr, 0))) <= prev) {
            PyErr_Clear();
            oi = -2;
            break;
        }
        prev = at;
    }
    if (oi == -2) {
        oi = -1;
        order_map = PyDict_New();
        if (order_map == NULL) {
            goto out;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(orders); i++) {
            PyObject *pr = PyTuple_GET_ITEM(orders, i);
            if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 2 ||
                PyDict_SetItem(order_map, PyTuple_GET_ITEM(pr, 0), PyTuple_GET_ITEM(pr, 1)) < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "malformed TreeSpec orders");
                }
                goto out;
            }
        }
    }
    {
        Py_ssize_t nn = PyTuple_GET_SIZE(nodes);
        /* the value stack and the children of one node: at most nn + 1 each */
        PyObject *inline_buf[2 * UNFLATTEN_INLINE];
        PyObject **st = inline_buf, **ch = inline_buf + UNFLATTEN_INLINE;
        Templates templates;
        templates.used = 0;
        if (nn + 1 > UNFLATTEN_INLINE) {
            st = PyMem_Malloc(2 * (nn + 1) * sizeof(PyObject *));
            if (st == NULL) {
                PyErr_NoMemory();
                goto out;
            }
            ch = st + nn + 1;
        }
        Py_ssize_t sp = 0, li = n;
        for (Py_ssize_t idx = nn - 1; idx >= 0; idx--) {
            PyObject *node = PyTuple_GET_ITEM(nodes, idx);
            int kind;
            Py_ssize_t arity;
            if (node_parts(node, &kind, &arity) < 0) {
                goto fail;
            }
            if (kind == K_LEAF) {
                if (li <= 0) {
                    PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: too many leaf nodes");
                    goto fail;
                }
                --li;
                if (is_list && li >= PyList_GET_SIZE(seq)) {
                    PyErr_SetString(PyExc_IndexError, "list index out of range");
                    goto fail;
                }
                PyObject *x = is_list ? PyList_GET_ITEM(seq, li) : PyTuple_GET_ITEM(seq, li);
                Py_INCREF(x);
                st[sp++] = x;
                continue;
            }
            if (arity > sp) {
                PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: arity exceeds the nodes");
                goto fail;
            }
            if (kind == K_TUPLE || kind == K_LIST) {
                /* the children's references move from the stack into the new container */
                PyObject *v = kind == K_TUPLE ? PyTuple_New(arity) : list_to_fill(arity);
                if (v == NULL) {
                    goto fail;
                }
                PyObject **items = kind == K_TUPLE ? ((PyTupleObject *)v)->ob_item
                                                   : ((PyListObject *)v)->ob_item;
                for (Py_ssize_t i = 0; i < arity; i++) {
                    items[i] = st[sp - 1 - i];
                }
                sp -= arity;
                st[sp++] = v;
                continue;
            }
            PyObject *order = NULL;
            while (oi >= 0 && order_index(orders, oi) > idx) {
                oi--;
            }
            if (oi >= 0 && order_index(orders, oi) == idx) {
                order = PyTuple_GET_ITEM(PyTuple_GET_ITEM(orders, oi--), 1);
            }
            if (order_map != NULL) {
                PyObject *key = PyLong_FromSsize_t(idx);
                if (key == NULL) {
                    goto fail;
                }
                order = PyDict_GetItemWithError(order_map, key);
                Py_DECREF(key);
                if (order == NULL && PyErr_Occurred()) {
                    goto fail;
                }
            }
            PyObject *v;
            PyObject *aux = PyTuple_GET_ITEM(node, 3);
            if (kind == K_DICT && order == NULL && PyTuple_CheckExact(aux) &&
                PyTuple_GET_SIZE(aux) == arity) {
                /* build()'s dict in key order, read straight off the stack,
                 * whose references move into it */
                if ((v = dict_of(&templates, aux, &st[sp - 1], arity, -1)) == NULL) {
                    goto fail;
                }
                sp -= arity;
                st[sp++] = v;
                continue;
            }
            else {
                for (Py_ssize_t i = 0; i < arity; i++) {
                    ch[i] = st[sp - 1 - i];
                }
                if ((v = build(kind, node, ch, arity, order)) == NULL) {
                    goto fail;
                }
            }
            for (Py_ssize_t i = 0; i < arity; i++) {
                Py_DECREF(st[--sp]);
            }
            st[sp++] = v;
        }
        if (sp != 1) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: the nodes do not make one tree");
            goto fail;
        }
        result = st[0];
        sp = 0;
    fail:
        while (sp > 0) {
            Py_DECREF(st[--sp]);
        }
        if (templates.used) {
            templates_clear(&templates);
        }
        if (st != inline_buf) {
            PyMem_Free(st);
        }
    }
out:
    Py_XDECREF(order_map);
    Py_DECREF(seq);
    Py_DECREF(nodes);
    Py_DECREF(orders);
    return result;
}

/* ------------------------------------------------------------------------ */
/* flatten_up_to */

typedef struct {
    PyObject *label, *other;
    Stack *s;
} Up;

static int dict_children_match(PyObject *res, Py_ssize_t arity, PyObject *aux, int kind,
                               PyObject **children, PyObject **names, int *keymode);

/* Ask _pure._match; returns 1 with children etc. set, -1 on error. */
static int
match_python(Up *u, PyObject *node, PyObject *obj, PyObject **children, PyObject **names,
             int *keymode)
{
    if (stack_freeze(u->s) < 0) {
        return -1;
    }
    PyObject *st = stack_py(u->s);
    if (st == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallFunctionObjArgs(py_match, node, obj, st, u->label, u->other, NULL);
    Py_DECREF(st);
    if (res == NULL) {
        return -1;
    }
    PyObject *ch = PyTuple_GET_ITEM(res, 0);
    if (PyTuple_Check(ch) || PyList_Check(ch)) {
        Py_INCREF(ch);
    }
    else if ((ch = PySequence_Tuple(ch)) == NULL) {
        Py_DECREF(res);
        return -1;
    }
    *children = ch;
    *keymode = (int)PyLong_AsLong(PyTuple_GET_ITEM(res, 1));
    *names = PyTuple_GET_ITEM(res, 2);
    if (*names == Py_None) {
        *names = NULL;
    }
    else {
        Py_INCREF(*names);
    }
    Py_DECREF(res);
    return 1;
}

static int
mismatch(Up *u, PyObject *node, PyObject *obj)
{
    if (stack_freeze(u->s) < 0) {
        return -1;
    }
    PyObject *st = stack_py(u->s);
    if (st == NULL) {
        return -1;
    }
    PyObject *exc = PyObject_CallFunctionObjArgs(py_mismatch, st, u->label, node, obj, u->other, NULL);
    Py_DECREF(st);
    return raise_returned(exc);
}

static TypeEntry *up_plan(Ctx *c, PyTypeObject *ot);

/* Whether the n entries of the exact dict obj are keys[0 .. n), in that
 * order, as the same exact str objects: then vals[0 .. n) are its values
 * (borrowed), read in one pass with no lookup, which could have run no user
 * code either. The caller has checked that obj has n entries. */
static int
dict_in_order(PyObject *obj, PyObject *keys, Py_ssize_t n, PyObject **vals)
{
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *v;
#if LAYOUT_311
    PyObject **p;
    Py_ssize_t step;
    if (dict_table(obj, &p, &step)) {
        if (step != 2) { /* not all keys are exact str */
            return 0;
        }
        for (; j < n && p[0] == PyTuple_GET_ITEM(keys, j); j++, p += 2) {
            vals[j] = p[1];
        }
        return j == n;
    }
#endif
    while (PyDict_Next(obj, &pos, &k, &v) && k == PyTuple_GET_ITEM(keys, j) &&
           PyUnicode_CheckExact(k)) {
        vals[j++] = v;
    }
    return j == n;
}

/* Children of obj, which must match node; 1 with outputs set, -1 on error. */
static int
match(Up *u, Ctx *c, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj,
      PyObject **children, PyObject **names, int *keymode, int *live)
{
    PyTypeObject *ot = Py_TYPE(obj);
    PyObject *t = PyTuple_GET_ITEM(node, 1);
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    *live = 0;
    *names = NULL;
    *keymode = KM_SEQ;
    switch (kind) {
    case K_TUPLE:
        if (ot == &PyTuple_Type && PyTuple_GET_SIZE(obj) == arity) {
            Py_INCREF(obj);
            *children = obj;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_LIST:
        if (ot == &PyList_Type && PyList_GET_SIZE(obj) == arity) {
            Py_INCREF(obj);
            *children = obj;
            *live = 1;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_NONE:
        if (obj == Py_None) {
            Py_INCREF(empty_tuple);
            *children = empty_tuple;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_DICT:
        if (ot == &PyDict_Type && PyTuple_CheckExact(aux) && PyDict_GET_SIZE(obj) == arity &&
            PyTuple_GET_SIZE(aux) == arity) {
            Py_ssize_t i = 0;
            while (i < arity && PyUnicode_CheckExact(PyTuple_GET_ITEM(aux, i))) {
                i++;
            }
            if (i < arity && stack_freeze(u->s) < 0) {
                return -1; /* keys other than str: their __eq__ may run */
            }
            if (i == arity && arity > 0) {
                PyObject *values = PyTuple_New(arity);
                if (values == NULL) {
                    return -1;
                }
                PyObject **items = ((PyTupleObject *)values)->ob_item;
                if (dict_in_order(obj, aux, arity, items)) {
                    for (Py_ssize_t j = 0; j < arity; j++) {
                        Py_INCREF(items[j]);
                    }
                    *children = values;
                    Py_INCREF(aux);
                    *names = aux;
                    *keymode = KM_MAP;
                    return 1;
                }
                memset(items, 0, arity * sizeof(PyObject *)); /* borrowed: not the tuple's */
                Py_DECREF(values);
            }
            for (Py_ssize_t i = 0; i < arity; i++) {
                int r = PyDict_Contains(obj, PyTuple_GET_ITEM(aux, i));
                if (r < 0) {
                    return -1;
                }
                if (!r) {
                    return mismatch(u, node, obj); /* as the pure engine: no lookup again */
                }
            }
            PyObject *values = dict_values(obj, ((PyTupleObject *)aux)->ob_item, arity);
            if (values == NULL) {
                return -1;
            }
            *children = values;
            Py_INCREF(aux);
            *names = aux;
            *keymode = KM_MAP;
            return 1;
        }
        break;
    case K_NAMEDTUPLE:
        if ((PyObject *)ot == t) {
            if (PyTuple_GET_SIZE(obj) != arity) {
                break; /* the pure engine decides what this is */
            }
            Py_INCREF(obj);
            *children = obj;
            Py_INCREF(aux);
            *names = aux;
            *keymode = KM_ATTR;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_DATACLASS:
    case K_ATTRS:
        if ((PyObject *)ot == t) {
            TypeEntry *e = up_plan(c, ot);
            if (e == NULL) {
                return -1;
            }
            if (e->plan != (kind == K_DATACLASS ? PLAN_DATACLASS : PLAN_ATTRS)) {
                break;
            }
            Found f;
            int r = record_fields(c, NULL, obj, e, kind, &f, 1);
            if (r < 0) {
                return -1;
            }
            if (r == 2) {
                break;
            }
            PyObject *mine = PyTuple_GET_ITEM(f.node, 3);
            int eq = mine == aux ? 1 : PyObject_RichCompareBool(mine, aux, Py_EQ);
            Py_DECREF(f.node);
            if (eq <= 0) {
                Py_DECREF(f.children);
                Py_DECREF(f.names);
                return eq < 0 ? -1 : mismatch(u, node, obj);
            }
            *children = f.children;
            *names = f.names;
            *keymode = KM_ATTR;
            return 1;
        }
        return mismatch(u, node, obj);
    case K_CUSTOM:
    case K_RULE:
        if ((PyObject *)ot == t) {
            PyObject *res;
            if (kind == K_CUSTOM) {
                res = PyObject_CallMethodNoArgs(obj, s_tree_flatten);
            }
            else {
                if (!PyTuple_CheckExact(aux) || PyTuple_GET_SIZE(aux) != 3) {
                    break;
                }
                PyObject *fn = PyObject_GetAttr(PyTuple_GET_ITEM(aux, 0), s_flatten);
                res = fn ? PyObject_CallOneArg(fn, obj) : NULL;
                Py_XDECREF(fn);
            }
            if (res == NULL) {
                return -1;
            }
            int r = dict_children_match(res, arity, aux, kind, children, names, keymode);
            if (r != 0) {
                Py_DECREF(res);
                return r < 0 ? -1 : (r == 1 ? 1 : mismatch(u, node, obj));
            }
            PyObject *ch, *tail, *keys;
            int km;
            r = user_result(c, u->s, res, ot, kind == K_CUSTOM ? py_custom_result : py_rule_result,
                                &ch, &tail, &keys, &km);
            Py_DECREF(res);
            if (r < 0) {
                return -1;
            }
            int eq = 0;
            if (PyTuple_GET_SIZE(ch) == arity) {
                /* tail == the node's, item by item as a tuple compares, ours
                 * on the left as in the pure engine: a CUSTOM node's aux is
                 * the tail, a RULE node's (rule, *tail) */
                Py_ssize_t at = kind == K_CUSTOM ? 0 : 1, n = PyTuple_GET_SIZE(tail);
                if (PyTuple_CheckExact(aux) && PyTuple_GET_SIZE(aux) == at + n) {
                    eq = 1;
                    for (Py_ssize_t k = 0; k < n && eq > 0; k++) {
                        eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(tail, k),
                                                      PyTuple_GET_ITEM(aux, at + k), Py_EQ);
                    }
                }
            }
            Py_DECREF(tail);
            if (eq <= 0) {
                Py_DECREF(ch);
                Py_DECREF(keys);
                return eq < 0 ? -1 : mismatch(u, node, obj);
            }
            *children = ch;
            *names = keys == Py_None ? NULL : keys;
            if (keys == Py_None) {
                Py_DECREF(keys);
            }
            *keymode = km;
            return 1;
        }
        return mismatch(u, node, obj);
    default:
        break;
    }
    return match_python(u, node, obj, children, names, keymode);
}

/* flatten_up_to's common case of __tree_flatten__ or a rule returning
 * (dict, hashable aux): compared with the node without building the keys, as
 * the general path (and the pure engine) would compare them: the children's
 * count, then aux, then each key, ours on the left. Returns 1 with *children
 * (the values), *names and *keymode set, 2 for a mismatch, 0 when the result
 * is not this case (the general path takes it), -1 on error. */
static int
dict_children_match(PyObject *res, Py_ssize_t arity, PyObject *aux, int kind,
                    PyObject **children, PyObject **names, int *keymode)
{
    Py_ssize_t at = kind == K_CUSTOM ? 0 : 1;
    if (!PyTuple_CheckExact(res) || PyTuple_GET_SIZE(res) != 2 ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(res, 0)) || !PyTuple_CheckExact(aux) ||
        PyTuple_GET_SIZE(aux) != at + 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(aux, at + 1))) {
        return 0;
    }
    PyObject *ch = PyTuple_GET_ITEM(res, 0), *uaux = PyTuple_GET_ITEM(res, 1);
    PyObject *keys = PyTuple_GET_ITEM(aux, at + 1);
    if (PyObject_Hash(uaux) == -1) {
        PyErr_Clear(); /* the general path reports it, with the path */
        return 0;
    }
    Py_ssize_t n = PyDict_GET_SIZE(ch);
    if (n != arity) {
        return 2;
    }
    int eq = PyObject_RichCompareBool(uaux, PyTuple_GET_ITEM(aux, at), Py_EQ);
    if (eq <= 0) {
        return eq < 0 ? -1 : 2;
    }
    if (PyTuple_GET_SIZE(keys) != n) {
        return 2;
    }
    PyObject *vals = PyTuple_New(n), *key, *val;
    if (vals == NULL) {
        return -1;
    }
    Py_ssize_t pos = 0, k = 0;
    int same = 1; /* every key is the node's own object: nothing to call */
    while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
        if (key != PyTuple_GET_ITEM(keys, k)) {
            same = 0;
        }
        Py_INCREF(val);
        PyTuple_SET_ITEM(vals, k, val);
        k++;
    }
    PyObject *mine = NULL;
    if (!same) {
        /* a key's __eq__ may change the dict: compare a copy of its keys */
        mine = PyTuple_New(n);
        if (mine == NULL) {
            Py_DECREF(vals);
            return -1;
        }
        pos = k = 0;
        while (k < n && PyDict_Next(ch, &pos, &key, &val)) {
            Py_INCREF(key);
            PyTuple_SET_ITEM(mine, k, key);
            k++;
        }
        for (k = 0; k < n; k++) {
            eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(mine, k), PyTuple_GET_ITEM(keys, k),
                                          Py_EQ);
            if (eq <= 0) {
                Py_DECREF(mine);
                Py_DECREF(vals);
                return eq < 0 ? -1 : 2;
            }
        }
    }
    Py_XDECREF(mine);
    *children = vals;
    Py_INCREF(keys);
    *names = keys;
    *keymode = KM_MAP;
    return 1;
}

/* The plan for an exact type in flatten_up_to (made when first met). */
static TypeEntry *
up_plan(Ctx *c, PyTypeObject *ot)
{
    TypeEntry *e = tc_find(&c->types, ot);
    if (e != NULL && entry_refresh(e) < 0) {
        return NULL;
    }
    if (e == NULL && ((e = tc_add(&c->types, ot)) == NULL || plan_for(e) < 0)) {
        return NULL;
    }
    return e;
}

/* A dataclass or attrs instance whose spec node has only leaves below it and
 * every field set: append its field values to out. Returns 1 done, 0 when
 * match() must decide, -1 on error (a mismatch included). */
static int
record_leaves(Up *u, Ctx *c, int kind, Py_ssize_t arity, PyObject *node, PyObject *obj,
              Vec *out)
{
    TypeEntry *e = up_plan(c, Py_TYPE(obj));
    if (e == NULL) {
        return -1;
    }
    if (e->plan != (kind == K_DATACLASS ? PLAN_DATACLASS : PLAN_ATTRS) || e->info == NULL) {
        return 0;
    }
    PyObject *aux = PyTuple_GET_ITEM(node, 3);
    PyObject *names = PyTuple_GET_ITEM(e->info, 0);
    if (PyTuple_GET_SIZE(names) != arity) {
        return 0;
    }
    if (aux != e->info) {
        int eq = PyObject_RichCompareBool(aux, e->info, Py_EQ);
        if (eq <= 0) {
            return eq;
        }
    }
    PyObject *vals[32];
    Py_ssize_t absent;
    if (e->reads == NULL || arity > 32) {
        return 0;
    }
    int read = record_read(obj, e->reads, names, vals, &absent, NULL);
    if (read != 1) {
        return read == 2 ? 0 : -1; /* 2: match() has the pure engine decide */
    }
    if (absent) {
        /* an unset field: its aux differs from the spec's */
        for (Py_ssize_t j = 0; j < arity; j++) {
            Py_XDECREF(vals[j]);
        }
        return mismatch(u, node, obj);
    }
    int r = 1;
    for (Py_ssize_t j = 0; j < arity; j++) {
        if (r == 1 && emit(out, vals[j]) < 0) {
            r = -1;
        }
        Py_DECREF(vals[j]);
    }
    return r;
}

/* New references to src[j] into out for j = 0, 1, ... while nodes[i + j] is
 * the leaf node, for j < n and i + j < len(nodes): how many were taken, or -1
 * on failure. Leaves of the spec take any value: no user code runs. */
static inline Py_ssize_t
take_leaves(Vec *out, PyObject *const *src, Py_ssize_t n, PyObject *nodes, Py_ssize_t i)
{
    Py_ssize_t nn = PyTuple_GET_SIZE(nodes);
    PyObject *const *nd = ((PyTupleObject *)nodes)->ob_item + i;
    if (i >= nn || nd[0] != LEAF_NODE) {
        return 0;
    }
    Py_ssize_t m = n < nn - i ? n : nn - i;
    if (m == 1) {
        return emit(out, src[0]) < 0 ? -1 : 1; /* as the leaf of [tree, leaf] */
    }
    if (vec_reserve(out, m) < 0) {
        return -1;
    }
    PyObject **dst = out->v + out->n;
    Py_ssize_t j = 0;
    while (j < m && nd[j] == LEAF_NODE) {
        Py_INCREF(src[j]);
        dst[j] = src[j];
        j++;
    }
    out->n += j;
    return j;
}

/* nodes[i .. i + n) are all the shared leaf node */
static inline int
leaf_run(PyObject *nodes, Py_ssize_t i, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        if (PyTuple_GET_ITEM(nodes, i + j) != LEAF_NODE) {
            return 0;
        }
    }
    return 1;
}

/* The leaves of obj up to the spec's nodes, appended to out (the caller has
 * set up u, c and an empty s; s is empty again on success). */
static int
up_to_into(PyObject *nodes, PyObject *obj, Vec *out, Up *u, Ctx *c, Stack *s)
{
    Py_ssize_t nn = PyTuple_GET_SIZE(nodes), i = 0;
    Py_INCREF(obj);
    for (;;) {
        if (i >= nn) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: the nodes end early");
            goto error;
        }
        PyObject *node = PyTuple_GET_ITEM(nodes, i++);
        int kind;
        Py_ssize_t arity;
        if (node_parts(node, &kind, &arity) < 0) {
            goto error;
        }
        if (kind == K_LEAF) {
            if (emit(out, obj) < 0) {
                goto error;
            }
        }
        else {
            PyObject *children = NULL, *names = NULL;
            int keymode, live;
            if (kind == K_DICT && arity <= 32 && i + arity <= nn && PyDict_CheckExact(obj) &&
                PyDict_GET_SIZE(obj) == arity && leaf_run(nodes, i, arity)) {
                /* a dict of leaves with str keys: one pass, nothing to visit */
                PyObject *keys = PyTuple_GET_ITEM(node, 3), *vals[32];
                Py_ssize_t j = 0;
                if (PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == arity) {
                    if (dict_in_order(obj, keys, arity, vals)) {
                        j = arity;
                    }
                    for (; j < arity; j++) {
                        PyObject *k = PyTuple_GET_ITEM(keys, j);
                        if (!PyUnicode_CheckExact(k) ||
                            (vals[j] = PyDict_GetItemWithError(obj, k)) == NULL) {
                            break;
                        }
                    }
                }
                if (PyErr_Occurred()) {
                    goto error;
                }
                if (j == arity) {
                    if (vec_extend(out, vals, arity) < 0) {
                        goto error;
                    }
                    i += arity;
                    goto next;
                }
            }
            if ((kind == K_DATACLASS || kind == K_ATTRS) && arity <= 32 && i + arity <= nn &&
                (PyObject *)Py_TYPE(obj) == PyTuple_GET_ITEM(node, 1) && !PyDict_Check(obj) &&
                leaf_run(nodes, i, arity)) {
                /* a record of leaves, every field set: its values, nothing to visit */
                if (stack_freeze(s) < 0) {
                    goto error;
                }
                int r = record_leaves(u, c, kind, arity, node, obj, out);
                if (r < 0) {
                    goto error;
                }
                if (r == 1) {
                    i += arity;
                    goto next;
                }
            }
            if (kind != K_TUPLE && kind != K_LIST && kind != K_NONE && kind != K_DICT &&
                kind != K_NAMEDTUPLE && stack_freeze(s) < 0) {
                goto error;
            }
            if (match(u, c, kind, arity, node, obj, &children, &names, &keymode, &live) < 0) {
                goto error;
            }
            Py_ssize_t nch = PyTuple_Check(children) ? PyTuple_GET_SIZE(children)
                                                      : PyList_GET_SIZE(children);
            if (nch) {
                /* the leading children that are leaves of the spec are taken now;
                 * a frame reads the rest, if any */
                Py_ssize_t k = take_leaves(out, seq_items(children), nch, nodes, i);
                if (k == nch || k < 0) {
                    Py_DECREF(children);
                    Py_XDECREF(names);
                    if (k < 0) {
                        goto error;
                    }
                }
                else if (stack_push(s, obj, children, names, keymode, live, 0) < 0) {
                    goto error;
                }
                else {
                    s->v[s->n - 1].pos = k;
                }
                i += k;
            }
            else {
                Py_DECREF(children);
                Py_XDECREF(names);
            }
        }
    next:
        Py_CLEAR(obj);
        while (s->n) {
            Frame *fr = &s->v[s->n - 1];
            if (fr->pos < fr->n) {
                if (frame_check(fr) < 0) {
                    goto error;
                }
                Py_ssize_t k = take_leaves(out, seq_items(fr->children) + fr->pos,
                                           fr->n - fr->pos, nodes, i);
                if (k < 0) {
                    goto error;
                }
                fr->pos += k;
                i += k;
                if (fr->pos == fr->n) {
                    continue;
                }
                if (frame_check(fr) < 0) {
                    goto error;
                }
                obj = frame_item(fr, fr->pos++);
                Py_INCREF(obj);
                break;
            }
            stack_pop(s);
        }
        if (obj == NULL) {
            break;
        }
    }
    return 0;
error:
    Py_XDECREF(obj);
    return -1;
}

/* What one flatten_up_to call (of one tree or of many) holds. */
typedef struct {
    PyObject *nodes; /* the spec's, strong */
    Py_ssize_t nleaves;
    Stack s;
    Ctx c;
    Up u;
} UpCall;

static int
up_to_setup(UpCall *call, PyObject *const *args, Py_ssize_t nargs, const char *usage)
{
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    PyObject *orders;
    if (spec_parts(args[0], &call->nodes, &orders, &call->nleaves) < 0) {
        return -1;
    }
    stack_init(&call->s);
    ctx_init(&call->c, Py_None, NULL, 1); /* cannot fail without rules */
    call->u.s = &call->s;
    call->u.label = nargs > 2 ? args[2] : s_the_spec;
    call->u.other = nargs > 3 ? args[3] : s_the_tree;
    Py_INCREF(call->u.label);
    Py_INCREF(call->u.other);
    Py_INCREF(call->nodes);
    return 0;
}

static void
up_to_clear(UpCall *call)
{
    Py_DECREF(call->nodes);
    Py_XDECREF(call->u.label);
    Py_XDECREF(call->u.other);
    stack_clear(&call->s);
    ctx_clear(&call->c);
}

static PyObject *
sp_flatten_up_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    UpCall call;
    if (up_to_setup(&call, args, nargs,
                    "flatten_up_to(spec, tree, label='the spec', other='the tree') takes 2 to 4 "
                    "arguments") < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    Vec out;
    vec_init(&out);
    Py_ssize_t nn = PyTuple_GET_SIZE(call.nodes), nleaves = call.nleaves;
    /* a spec has no more leaves than nodes */
    if ((nleaves <= VEC_INLINE || vec_reserve(&out, nleaves < nn ? nleaves : nn) == 0) &&
        up_to_into(call.nodes, args[1], &out, &call.u, &call.c, &call.s) == 0) {
        result = vec_to_list(&out);
    }
    vec_clear(&out);
    up_to_clear(&call);
    return result;
}

/* flatten_up_to_columns(spec, trees): flatten_up_to of each tree, as one list
 * per leaf of the spec: columns[j][k] is leaf j of trees[k]. */
static PyObject *
sp_flatten_up_to_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    UpCall call;
    if (up_to_setup(&call, args, nargs,
                    "flatten_up_to_columns(spec, trees, label='the spec', other='the tree') "
                    "takes 2 to 4 arguments") < 0) {
        return NULL;
    }
    Py_ssize_t nleaves = call.nleaves;
    PyObject *columns = NULL;
    /* a tuple of its own: user code run while flattening cannot change it */
    PyObject *trees = PySequence_Tuple(args[1]);
    Vec out;
    vec_init(&out);
    if (trees == NULL || (columns = PyList_New(nleaves)) == NULL) {
        goto error;
    }
    Py_ssize_t ntrees = PyTuple_GET_SIZE(trees);
    for (Py_ssize_t j = 0; j < nleaves; j++) {
        PyObject *col = PyList_New(ntrees);
        if (col == NULL) {
            goto error;
        }
        PyList_SET_ITEM(columns, j, col);
    }
    for (Py_ssize_t k = 0; k < ntrees; k++) {
        if (up_to_into(call.nodes, PyTuple_GET_ITEM(trees, k), &out, &call.u, &call.c,
                       &call.s) < 0) {
            goto error;
        }
        if (out.n != nleaves) {
            PyErr_SetString(PyExc_ValueError, "malformed TreeSpec: num_leaves does not match");
            goto error;
        }
        for (Py_ssize_t j = 0; j < nleaves; j++) {
            /* moves the reference: the list item was NULL */
            PyList_SET_ITEM(PyList_GET_ITEM(columns, j), k, out.v[j]);
        }
        out.n = 0;
    }
    vec_clear(&out);
    Py_DECREF(trees);
    up_to_clear(&call);
    return columns;
error:
    vec_clear(&out);
    Py_XDECREF(trees);
    Py_XDECREF(columns);
    up_to_clear(&call);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Module */

static PyObject *sp_field_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

PyObject *
pk_unflatten(PyObject *spec, PyObject *leaves)
{
    PyObject *args[2] = {spec, leaves};
    return sp_unflatten(NULL, args, 2);
}

PyObject *
pk_flatten_up_to(PyObject *spec, PyObject *tree)
{
    PyObject *args[2] = {spec, tree};
    return sp_flatten_up_to(NULL, args, 2);
}

/* _plans_made(): how many times the engine has worked out how to read a
 * class (for tests: a class met again, unchanged, is not read again) */
static PyObject *
sp_plans_made(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(plans_made);
}

static PyMethodDef methods[] = {
    {"flatten", (PyCFunction)(void (*)(void))sp_flatten, METH_FASTCALL,
     "flatten(tree, is_leaf=None, rules=None) -> (leaves, spec)"},
    {"leaves", (PyCFunction)(void (*)(void))sp_leaves, METH_FASTCALL,
     "leaves(tree, is_leaf=None, rules=None) -> leaves"},
    {"iter_leaves", (PyCFunction)(void (*)(void))sp_iter_leaves, METH_FASTCALL,
     "iter_leaves(tree, is_leaf=None, rules=None) -> an iterator over the leaves"},
    {"flatten_with_path", (PyCFunction)(void (*)(void))sp_flatten_with_path, METH_FASTCALL,
     "flatten_with_path(tree, is_leaf=None, rules=None) -> ([(path, leaf), ...], spec)"},
    {"unflatten", (PyCFunction)(void (*)(void))sp_unflatten, METH_FASTCALL,
     "unflatten(spec, leaves) -> tree"},
    {"flatten_up_to_columns", (PyCFunction)(void (*)(void))sp_flatten_up_to_columns,
     METH_FASTCALL,
     "flatten_up_to_columns(spec, trees, label='the spec', other='the tree') -> columns"},
    {"flatten_up_to", (PyCFunction)(void (*)(void))sp_flatten_up_to, METH_FASTCALL,
     "flatten_up_to(spec, tree, label='the spec', other='the tree') -> leaves"},
    {"keystr", (PyCFunction)pk_keystr, METH_O, "keystr(path) -> ''.join(map(str, path))"},
    {"spec_compose", (PyCFunction)(void (*)(void))pk_spec_compose, METH_FASTCALL,
     "spec_compose(outer_nodes, outer_orders, inner_nodes, inner_orders) -> (nodes, orders)"},
    {"spec_is_prefix", (PyCFunction)(void (*)(void))pk_spec_is_prefix, METH_FASTCALL,
     "spec_is_prefix(mine, theirs) -> whether the nodes mine are a prefix of theirs"},
    {"spec_paths", (PyCFunction)(void (*)(void))pk_spec_paths, METH_FASTCALL,
     "spec_paths(nodes) -> the path of each leaf"},
    {"first_reaching", (PyCFunction)(void (*)(void))pk_first_reaching, METH_FASTCALL,
     "first_reaching(leaves, start, target, skip, opaque, registered, limit) -> index or -1"},
    {"packed_sample", (PyCFunction)(void (*)(void))pk_packed_sample, METH_FASTCALL,
     "packed_sample(bufs, specs, i, make) -> sample i of a packed dataset"},
    {"number_list", (PyCFunction)pk_number_list, METH_O,
     "number_list(x) -> whether x is a non-empty list of exact ints or of exact floats"},
    {"leaf_codes", (PyCFunction)pk_leaf_codes, METH_O,
     "leaf_codes(leaves) -> each leaf's packing code, or None"},
    {"_field_codes", (PyCFunction)(void (*)(void))sp_field_codes, METH_FASTCALL,
     "_field_codes(cls, names) -> how each field is read (for tests)"},
    {"_plans_made", sp_plans_made, METH_NOARGS,
     "_plans_made() -> how many times a class's plan was worked out (for tests)"},
    {NULL, NULL, 0, NULL},
};

#if LAYOUT_311
/* Sets values_reads_ok when CPython lays instance values out as field_read
 * expects: reads of a class made here must agree with PyObject_GetAttr, before
 * and after a value is deleted. A failure of any kind just leaves it off. */
static void
values_reads_check(void)
{
    PyObject *cls = NULL, *obj = NULL, *names = NULL, *reads = NULL, *vals[3] = {0};
    int ok = 0;
    values_reads_ok = 1;
    cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_Probe");
    obj = cls ? PyObject_CallNoArgs(cls) : NULL;
    names = Py_BuildValue("(sss)", "first", "second", "third");
    if (obj == NULL || names == NULL || !PyType_HasFeature((PyTypeObject *)cls, Py_TPFLAGS_MANAGED_DICT)) {
        goto done;
    }
    for (int i = 2; i >= 0; i--) { /* set in another order than read */
        if ((vals[i] = PyList_New(0)) == NULL ||
            PyObject_SetAttr(obj, PyTuple_GET_ITEM(names, i), vals[i]) < 0) {
            goto done;
        }
    }
    reads = field_reads((PyTypeObject *)cls, names);
    if (reads == NULL) {
        goto done;
    }
    const FieldReads *r = reads_of(reads);
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *v = r->code[i] < 0 ? field_read(obj, r, i, PyTuple_GET_ITEM(names, i)) : NULL;
        Py_XDECREF(v);
        if (v != vals[i]) {
            goto done;
        }
    }
    if (PyObject_DelAttr(obj, PyTuple_GET_ITEM(names, 1)) < 0) {
        goto done;
    }
    PyObject *gone = field_read(obj, r, 1, PyTuple_GET_ITEM(names, 1));
    if (gone != NULL) {
        Py_DECREF(gone);
        goto done;
    }
    ok = PyErr_ExceptionMatches(PyExc_AttributeError);
done:
    PyErr_Clear();
    values_reads_ok = ok;
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(vals[i]);
    }
    Py_XDECREF(reads);
    Py_XDECREF(names);
    Py_XDECREF(obj);
    Py_XDECREF(cls);
}

/* Sets dict_layout_ok when a dict's table reads as dict_table expects (the
 * items PyDict_Next gives, and no direct read once a key is deleted), and
 * dicts copied from a template and given their values in place
 * (dict_from_template) are what inserting gives: for str keys and int keys,
 * values found by lookup, iteration order, size, equality, GC tracking, and
 * the dict still usable (an insert that grows it, a delete). A failure of any
 * kind leaves both off. */
static void
dict_layout_check(void)
{
    /* a dict made by PyDict_New holds the shared empty table, whose count
     * must come back to where it was */
    PyObject *e0 = PyDict_New();
    Keys311 *empty = e0 ? (Keys311 *)((PyDictObject *)e0)->ma_keys : NULL;
    Py_ssize_t empty_count = empty ? empty->dk_refcnt : -1;
    int ok = e0 != NULL && !PyObject_GC_IsTracked(e0);
    dict_layout_ok = 1;
    for (int kind = 0; kind < 2 && ok; kind++) {
        PyObject *keys = kind ? Py_BuildValue("(iii)", 7, -3, 1 << 20)
                              : Py_BuildValue("(sss)", "a", "c", "b");
        PyObject *vals[3] = {PyList_New(0), PyLong_FromLong(5), Py_None};
        Py_ssize_t key_count = keys ? Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) : 0;
        PyObject *tmpl = NULL, *d = NULL, *want = NULL, *extra = NULL;
        Py_INCREF(Py_None);
        Template e = {keys, NULL, 0, 0};
        ok = keys && vals[0] && vals[1] && template_make(&e, keys, 3) == 0 && !e.unusable &&
             (want = dict_in_key_order(keys, vals, 3, 1));
        if (ok) {
            for (int i = 0; i < 3; i++) { /* the references the copy takes over */
                Py_INCREF(vals[i]);
            }
            ok = dict_from_template(&e, vals, 3, 1, &d) == 1;
            for (int i = 0; !ok && i < 3; i++) {
                Py_DECREF(vals[i]);
            }
        }
        tmpl = e.dict;
        PyObject **p = NULL;
        Py_ssize_t step = 0;
        ok = ok && dict_table(want, &p, &step) && step == (kind ? 3 : 2);
        for (Py_ssize_t i = 0; ok && i < 3; i++) {
            ok = p[i * step] == PyTuple_GET_ITEM(keys, i) && p[i * step + 1] == vals[i];
        }
        if (ok) {
            Py_ssize_t pos = 0, i = 0;
            PyObject *k, *v;
            while (ok && PyDict_Next(d, &pos, &k, &v)) {
                ok = i < 3 && k == PyTuple_GET_ITEM(keys, i) && v == vals[i] &&
                     PyDict_GetItemWithError(d, k) == vals[i];
                i++;
            }
            ok = ok && i == 3 && PyDict_GET_SIZE(d) == 3 &&
                 PyObject_RichCompareBool(d, want, Py_EQ) == 1 &&
                 PyObject_GC_IsTracked(d) == PyObject_GC_IsTracked(want) &&
                 PyObject_GC_IsTracked(d) && !PyObject_GC_IsTracked(tmpl) &&
                 PyDict_GetItemWithError(tmpl, PyTuple_GET_ITEM(keys, 0)) == Py_None;
            for (long j = 0; ok && j < 20; j++) {
                ok = (extra = PyLong_FromLong(100 + j)) && PyDict_SetItem(d, extra, extra) == 0;
                Py_CLEAR(extra);
            }
            ok = ok && PyDict_DelItem(d, PyTuple_GET_ITEM(keys, 1)) == 0 &&
                 PyDict_GET_SIZE(d) == 22 && !dict_table(d, &p, &step) &&
                 PyDict_GetItemWithError(d, PyTuple_GET_ITEM(keys, 2)) == vals[2];
        }
        Py_XDECREF(d);
        Py_XDECREF(want);
        Py_XDECREF(tmpl);
        /* every reference the copies took is given back */
        ok = ok && Py_REFCNT(vals[0]) == 1 && Py_REFCNT(PyTuple_GET_ITEM(keys, 0)) == key_count;
        Py_XDECREF(keys);
        for (int i = 0; i < 3; i++) {
            Py_XDECREF(vals[i]);
        }
    }
    ok = ok && empty->dk_refcnt == empty_count;
    Py_XDECREF(e0);
    PyErr_Clear();
    dict_layout_ok = ok;
}
#endif

#if VERSION_TAGS
/* Sets version_tags_ok when CPython keeps version tags as plan_saved and
 * entry_fresh rely on: a class that has been looked up has a tag other than 0,
 * its own; setting an attribute on a class changes its tag and its
 * subclasses' tags (to 0, or to a new one once looked up again), and leaves
 * its bases' alone. A failure of any kind leaves it off. */
static void
version_tags_check(void)
{
    PyObject *base = NULL, *sub = NULL, *bases = NULL, *name = NULL, *one = NULL;
    int ok = 0;
    version_tags_ok = 1;
    base = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "_ProbeBase");
    bases = base ? PyTuple_Pack(1, base) : NULL;
    sub = bases ? PyObject_CallFunction((PyObject *)&PyType_Type, "sO{}", "_ProbeSub", bases)
                : NULL;
    name = PyUnicode_InternFromString("_probe_attribute");
    one = PyLong_FromLong(1);
    if (sub == NULL || name == NULL || one == NULL) {
        goto done;
    }
    PyTypeObject *b = (PyTypeObject *)base, *t = (PyTypeObject *)sub;
    /* a lookup gives a class a tag (CPython's method cache) */
    (void)_PyType_Lookup(b, name);
    (void)_PyType_Lookup(t, name);
    unsigned int b0 = type_version(b), t0 = type_version(t);
    if (b0 == 0 || t0 == 0 || b0 == t0 || PyObject_SetAttr(base, name, one) < 0 ||
        type_version(b) == b0 || type_version(t) == t0) {
        goto done;
    }
    (void)_PyType_Lookup(b, name);
    (void)_PyType_Lookup(t, name);
    unsigned int b1 = type_version(b), t1 = type_version(t);
    if (b1 == 0 || t1 == 0 || b1 == t1 || b1 == b0 || b1 == t0 || t1 == b0 || t1 == t0 ||
        PyObject_SetAttr(sub, name, one) < 0) {
        goto done;
    }
    (void)_PyType_Lookup(t, name);
    ok = type_version(b) == b1 && type_version(t) != t1 && type_version(t) != 0;
done:
    PyErr_Clear();
    version_tags_ok = ok;
    Py_XDECREF(one);
    Py_XDECREF(name);
    Py_XDECREF(sub);
    Py_XDECREF(bases);
    Py_XDECREF(base);
}
#endif

#if INT_DIGITS
/* Sets int_digits_ok when small_long's reads of ob_size and ob_digit give
 * what PyLong_AsSsize_t gives, for ints of one digit and of several. */
static void
int_digits_check(void)
{
    static const long long probes[] = {
        0, 1, 7, 255, 32767, 32768, (1LL << 30) - 1, 1LL << 30, 1LL << 31, 1LL << 62,
    };
    int ok = 1;
    int_digits_ok = 1;
    for (size_t i = 0; ok && i < sizeof(probes) / sizeof(probes[0]); i++) {
        PyObject *o = PyLong_FromLongLong(probes[i]);
        if (o == NULL) {
            ok = 0;
            break;
        }
        Py_ssize_t size = Py_SIZE(o);
        /* zero has no digits; a digit holds at most 30 bits */
        ok = (probes[i] == 0) == (size == 0) && (probes[i] < (1LL << 30) || size > 1) &&
             small_long(o) == (Py_ssize_t)probes[i];
        Py_DECREF(o);
    }
    PyErr_Clear();
    int_digits_ok = ok;
}
#endif

/* _field_codes(cls, names): the read codes for names of instances of cls
 * (0: getattr, > 0: a slot's offset, < 0: a shared-keys index), for tests. */
static PyObject *
sp_field_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_field_codes(cls, names: tuple)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    PyObject *reads = field_reads((PyTypeObject *)args[0], args[1]);
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

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "pytree_kit._speedups",
    "The C engine of pytree_kit: the same results as pytree_kit._pure, faster.", -1, methods,
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
        PyErr_Format(PyExc_ImportError, "TreeSpec.%s is not a slot", name);
        return -1;
    }
    Py_ssize_t off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return off;
}

/* object.__dict__[name]: a new reference, or NULL with an error set. */
static PyObject *
object_own(PyObject *name)
{
    /* From 3.12 on, a static builtin type's tp_dict is NULL: its dict is
     * kept per interpreter, and PyType_GetDict gives it. */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *dict = PyType_GetDict(&PyBaseObject_Type);
#else
    PyObject *dict = Py_XNewRef(PyBaseObject_Type.tp_dict);
#endif
    if (dict == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "object has no __dict__");
        }
        return NULL;
    }
    PyObject *v = PyDict_GetItemWithError(dict, name);
    Py_DECREF(dict);
    if (v == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "object has no %U", name);
    }
    Py_XINCREF(v);
    return v;
}

#define INTERN(var, text)                                     \
    do {                                                      \
        if ((var = PyUnicode_InternFromString(text)) == NULL) \
            goto fail;                                        \
    } while (0)

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m = NULL, *pure = NULL, *spec = NULL, *keys = NULL, *kinds = NULL, *dc = NULL;
    m = PyModule_Create(&moduledef);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "NAME", "c") < 0) {
        goto fail;
    }
    pure = PyImport_ImportModule("pytree_kit._pure");
    spec = PyImport_ImportModule("pytree_kit._spec");
    keys = PyImport_ImportModule("pytree_kit._keys");
    kinds = PyImport_ImportModule("pytree_kit._kinds");
    dc = PyImport_ImportModule("dataclasses");
    if (!pure || !spec || !keys || !kinds || !dc) {
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
        !(py_customised = get_attr(pure, "_customised")) ||
        !(py_dict_order_differs = get_attr(pure, "dict_order_differs")) ||
        !(py_custom_result = get_attr(pure, "_custom_result")) ||
        !(py_rule_result = get_attr(pure, "_rule_result")) ||
        !(py_cycle_error = get_attr(pure, "_cycle_error")) || !(py_match = get_attr(pure, "_match")) ||
        !(py_mismatch = get_attr(pure, "_mismatch")) || !(py_build = get_attr(pure, "build")) ||
        !(SequenceKey_t = get_attr(keys, "SequenceKey")) || !(DictKey_t = get_attr(keys, "DictKey")) ||
        !(GetAttrKey_t = get_attr(keys, "GetAttrKey")) || !(FIELD_marker = get_attr(dc, "_FIELD"))) {
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
        (off_hash = slot_offset((PyObject *)TreeSpec_type, "_hash")) < 0) {
        goto fail;
    }
    if (PyType_Ready(&StackView_Type) < 0 || PyType_Ready(&LeafIter_Type) < 0 || pk_fastcall_add(m) < 0) {
        goto fail;
    }
    if ((empty_tuple = PyTuple_New(0)) == NULL) {
        goto fail;
    }
    INTERN(s_tree_flatten, "__tree_flatten__");
    INTERN(s_tree_unflatten, "__tree_unflatten__");
    INTERN(s_fields, "_fields");
    INTERN(s_n_sequence_fields, "n_sequence_fields");
    INTERN(s_n_fields, "n_fields");
    INTERN(s_dataclass_fields, "__dataclass_fields__");
    INTERN(s_attrs_attrs, "__attrs_attrs__");
    INTERN(s_field_type, "_field_type");
    INTERN(s_name, "name");
    INTERN(s_metadata, "metadata");
    INTERN(s_get, "get");
    INTERN(s_static, "static");
    INTERN(s_new, "__new__");
    INTERN(s_getattribute, "__getattribute__");
    if ((object_new_fn = object_own(s_new)) == NULL ||
        (object_getattribute_fn = object_own(s_getattribute)) == NULL) {
        goto fail;
    }
    INTERN(s_len, "__len__");
    INTERN(s_flatten, "flatten");
    INTERN(s_the_spec, "the spec");
    INTERN(s_the_tree, "the tree");
#if VERSION_TAGS
    version_tags_check();
#endif
#if INT_DIGITS
    int_digits_check();
#endif
#if LAYOUT_311
    values_reads_check();
    dict_layout_check();
#endif
    PyObject *fast = Py_BuildValue(
        "{sNsNsNsN}", "type_version_tags", PyBool_FromLong(VERSION_TAGS && version_tags_ok),
        "int_digits", PyBool_FromLong(INT_DIGITS && int_digits_ok), "instance_values",
        PyBool_FromLong(LAYOUT_311 && values_reads_ok), "dict_tables",
        PyBool_FromLong(LAYOUT_311 && dict_layout_ok));
    int added = fast == NULL ? -1 : PyModule_AddObjectRef(m, "FAST_PATHS", fast);
    Py_XDECREF(fast);
#ifdef PK_NO_FAST_PATHS
    const int no_fast_paths = 1;
#else
    const int no_fast_paths = 0;
#endif
    if (added < 0 ||
        PyModule_AddIntConstant(m, "VALUES_READS", LAYOUT_311 && values_reads_ok) < 0 ||
        PyModule_AddIntConstant(m, "DICT_TABLES", LAYOUT_311 && dict_layout_ok) < 0 ||
        PyModule_AddIntConstant(m, "VALIDATED_PYTHON", PK_VALIDATED_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "NO_FAST_PATHS", no_fast_paths) < 0) {
        goto fail;
    }
    Py_DECREF(pure);
    Py_DECREF(spec);
    Py_DECREF(keys);
    Py_DECREF(kinds);
    Py_DECREF(dc);
    return m;
fail:
    Py_XDECREF(pure);
    Py_XDECREF(spec);
    Py_XDECREF(keys);
    Py_XDECREF(kinds);
    Py_XDECREF(dc);
    Py_DECREF(m);
    return NULL;
}
