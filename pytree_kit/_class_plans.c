/* _class_plans.c: how the instances of a class are read (its class plan).
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *
 * The specification decides and C executes: what a class is (a leaf, a
 * namedtuple, a record and how each of its fields is read, a protocol class,
 * or a case for the pure engine) is asked of _pure.class_plan, once per
 * class, and the answer is turned into a TypeEntry the walks read:
 *   plan_from_python  _pure.class_plan's answer, in C's form (FieldReads)
 *   class_entry       a class's entry in this call's type cache: kept for the
 *                     whole call (as the pure engine keeps its per-call
 *                     cache), taken from the class memo when the class is
 *                     unchanged since, else asked of _pure
 *   tc_*              the per-call type cache
 * Across calls, a plan is kept in the class memo (_memo.c) under the class's
 * version tag and its metaclass's, which CPython changes whenever a class or
 * one of its bases is modified, and never gives twice: a (class, tag) match is
 * the same class, unchanged. From 3.12 on the tag is asked for with the public
 * PyUnstable_Type_AssignVersionTag; on 3.10 and 3.11, which have no public
 * way, it is read where that layout read was validated (_fast_type_version_tags.c's
 * type_version, the fast path type_version_tags), and elsewhere a plan lasts
 * one call. tags_check (run on import) checks the tags behave so, else no
 * plan is kept across calls.
 * Calls: _pure.class_plan, _fast_type_version_tags.c (class_tag),
 * _fast_split_values.c (layout_field_codes).
 */

#include "_core.h"

/* ------------------------------------------------------------------------ */
/* The per-call type cache */

PK_SHARED void
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

PK_SHARED TypeEntry *
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
    e->info = NULL;
    e->node = NULL;
    e->reads_obj = NULL;
    e->reads = NULL;
    return e;
}

/* ------------------------------------------------------------------------ */
/* _pure.class_plan's answer in C's form */

/* The FieldReads a class's reads_obj (a bytes object, or NULL) holds */
PK_SHARED_INLINE const FieldReads *
reads_of(PyObject *reads_obj)
{
    return reads_obj == NULL ? NULL : (const FieldReads *)PyBytes_AS_STRING(reads_obj);
}

/* how many times _pure.class_plan was asked (for tests: _plans_made()) */
PK_DATA Py_ssize_t plans_made;

/* The offset of the slot d, a member descriptor from class_plan, when an
 * instance of t holds its value as a PyObject pointer at that offset (NULL:
 * unset), as PyMember_GetOne reads a Py_T_OBJECT_EX member; else 0. */
static Py_ssize_t
slot_offset_of(PyTypeObject *t, PyObject *d)
{
    if (Py_TYPE(d) != &PyMemberDescr_Type || !PyType_IsSubtype(t, PyDescr_TYPE(d))) {
        return 0;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & PY_AUDIT_READ) || m->offset <= 0) {
        return 0;
    }
    return m->offset;
}

/* A record plan's reads, (names, reads, other_slots) of class_plan, as a
 * FieldReads in a bytes object (reads_of reads it): per field a slot's offset
 * or 0, and whether the instance __dict__'s value is getattr's; the offsets
 * of the slots that are no field's. NULL with no error set when the pure
 * engine must read the class's instances (its getattro is not the generic
 * one, a slot that is not a Py_T_OBJECT_EX one), NULL with an error on
 * failure. */
PK_SHARED PyObject *
record_reads(PyTypeObject *t, PyObject *names, PyObject *reads, PyObject *other)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names), n_slots = PyTuple_GET_SIZE(other);
    if (t->tp_getattro != PyObject_GenericGetAttr || PyTuple_GET_SIZE(reads) != n) {
        return NULL;
    }
    PyObject *b = PyBytes_FromStringAndSize(
        NULL, offsetof(FieldReads, code) + (2 * n + n_slots + 1) * sizeof(Py_ssize_t));
    if (b == NULL) {
        return NULL;
    }
    FieldReads *r = (FieldReads *)PyBytes_AS_STRING(b);
    r->keys = NULL;
    r->has_dict = t->tp_dictoffset != 0;
    r->n = n;
    r->n_values = 0;
    r->n_slots = n_slots;
    for (Py_ssize_t j = 0; j < n_slots; j++) {
        if ((READS_SLOT(r, j) = slot_offset_of(t, PyTuple_GET_ITEM(other, j))) == 0) {
            Py_DECREF(b);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *how = PyTuple_GET_ITEM(reads, i);
        r->code[i] = how == Py_True || how == Py_False ? 0 : slot_offset_of(t, how);
        READS_DICT_OK(r, i) = how == Py_True && PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i));
    }
    layout_field_codes(t, names, r);
    return b;
}

/* Whether a PLAN_MAPPING answer p has the shape _mapping_kind.c reads:
 * (code, base str, is_user bool, ((name str, descriptor), ...), has_dict bool,
 * cached frozenset, setters tuple). */
static int
mapping_info_ok(PyObject *p)
{
    PyObject *slots = PyTuple_GET_ITEM(p, 3);
    if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(p, 1)) || !PyBool_Check(PyTuple_GET_ITEM(p, 2)) ||
        !PyTuple_CheckExact(slots) || !PyBool_Check(PyTuple_GET_ITEM(p, 4)) ||
        !PyFrozenSet_CheckExact(PyTuple_GET_ITEM(p, 5)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(p, 6))) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
        PyObject *pair = PyTuple_GET_ITEM(slots, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
            return 0;
        }
    }
    return 1;
}

/* Fills e (its plan NULL-initialised, PLAN_PYTHON) from class_plan's answer
 * for e->type. 0; -1 on error. An answer of a shape C does not take leaves
 * PLAN_PYTHON: the pure engine classifies each instance. */
static int
plan_from_python(TypeEntry *e)
{
    PyTypeObject *t = e->type;
    PK_COUNT(plans_made);
    PyObject *p = PyObject_CallOneArg(py_class_plan, (PyObject *)t);
    if (p == NULL) {
        return -1;
    }
    long code = PyTuple_CheckExact(p) && PyTuple_GET_SIZE(p) >= 1 &&
                        PyLong_CheckExact(PyTuple_GET_ITEM(p, 0))
                    ? PyLong_AsLong(PyTuple_GET_ITEM(p, 0))
                    : -1;
    Py_ssize_t size = PyTuple_CheckExact(p) ? PyTuple_GET_SIZE(p) : 0;
    switch (code) {
    case PLAN_LEAF:
    case PLAN_TUPLE_LEAF:
    case PLAN_CUSTOM:
        e->plan = (int)code;
        break;
    case PLAN_NAMEDTUPLE:
        if (size == 2 && PyTuple_CheckExact(PyTuple_GET_ITEM(p, 1))) {
            e->plan = PLAN_NAMEDTUPLE;
            e->info = Py_NewRef(PyTuple_GET_ITEM(p, 1));
        }
        break;
    case PLAN_DATACLASS:
    case PLAN_ATTRS: {
        PyObject *names = size == 4 ? PyTuple_GET_ITEM(p, 1) : NULL;
        PyObject *reads = size == 4 ? PyTuple_GET_ITEM(p, 2) : NULL;
        PyObject *other = size == 4 ? PyTuple_GET_ITEM(p, 3) : NULL;
        if (names == NULL || !PyTuple_CheckExact(names) || !PyTuple_CheckExact(reads) ||
            !PyTuple_CheckExact(other)) {
            break;
        }
        e->reads_obj = record_reads(t, names, reads, other);
        if (e->reads_obj == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(p);
                return -1;
            }
            break;
        }
        /* the aux of an instance with every field set: (names, (), (), None) */
        e->info = PyTuple_Pack(4, names, empty_tuple, empty_tuple, Py_None);
        if (e->info == NULL) {
            Py_CLEAR(e->reads_obj);
            Py_DECREF(p);
            return -1;
        }
        e->reads = reads_of(e->reads_obj);
        e->plan = (int)code;
        break;
    }
    case PLAN_MAPPING:
        /* (base, is_user, slots, has_dict, cached, setters), read by _mapping_kind.c */
        if (size == 7 && mapping_info_ok(p)) {
            if ((e->info = PyTuple_GetSlice(p, 1, 7)) == NULL) {
                Py_DECREF(p);
                return -1;
            }
            e->plan = PLAN_MAPPING;
        }
        break;
    default:
        break;
    }
    Py_DECREF(p);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* A class's entry in this call's type cache */

/* Plans kept across calls: the class memo (_memo.c's plans table) holds what
 * plan_from_python made, keyed by the class's address and tag, with its
 * metaclass's tag (KeptPlan). An entry holds no reference to its class: a
 * class freed and another made at its address has another tag. */

/* e from the memo's plan for its class, when the class and its metaclass are
 * unchanged since it was kept: 1; else 0. Runs no code. */
static int
plan_kept(Memo *m, TypeEntry *e)
{
    PyTypeObject *t = e->type;
    unsigned int tag = class_tag(t, 0);
    if (tag == 0) {
        return 0;
    }
    unsigned int mtag = meta_tag(t, 0);
    PLANS_LOCK(m);
    KeptPlan *k = memo_find(&m->plans, (uintptr_t)t, tag);
    int found = k != NULL && k->meta_tag == mtag;
    if (found) {
        e->plan = k->plan;
        e->info = Py_XNewRef(k->info);
        e->reads_obj = Py_XNewRef(k->reads_obj);
    }
    PLANS_UNLOCK(m);
    if (found) {
        e->reads = reads_of(e->reads_obj);
    }
    return found;
}

/* Keep e's plan in the memo under its class's tag and its metaclass's, in
 * place of what the entry held, which is let go of last. Allocates nothing. */
static void
plan_keep(Memo *m, TypeEntry *e, unsigned int tag, unsigned int mtag)
{
    PLANS_LOCK(m);
    KeptPlan *k = memo_slot(&m->plans, (uintptr_t)e->type, tag);
    PyObject *old_info = k->info, *old_reads = k->reads_obj;
    k->meta_tag = mtag;
    k->plan = e->plan;
    k->info = Py_XNewRef(e->info);
    k->reads_obj = Py_XNewRef(e->reads_obj);
    PLANS_UNLOCK(m);
    Py_XDECREF(old_info);
    Py_XDECREF(old_reads);
}

/* The entry of t in this call's type cache, made now: from the memo when it
 * keeps t's plan, else asked of _pure.class_plan, with the lists being read
 * copied first (s, when not NULL: class_plan runs Python code). NULL on
 * error. */
PK_SHARED TypeEntry *
class_entry(Ctx *c, Stack *s, PyTypeObject *t)
{
    TypeEntry *e = tc_add(&c->types, t);
    if (e == NULL || plan_kept(&c->st->memo, e)) {
        return e;
    }
    if (s != NULL && stack_freeze(s) < 0) {
        return NULL;
    }
    unsigned int tag = class_tag(t, 1), mtag = meta_tag(t, 1);
    if (plan_from_python(e) < 0) {
        return NULL;
    }
    /* kept only if nothing changed t while class_plan ran */
    if (tag != 0 && mtag != 0 && class_tag(t, 0) == tag && meta_tag(t, 0) == mtag) {
        plan_keep(&c->st->memo, e, tag, mtag);
    }
    return e;
}
