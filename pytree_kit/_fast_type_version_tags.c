/* _fast_type_version_tags.c: a class's version tag, the key under which its
 * plan is kept across calls, and the fast path type_version_tags, which
 * reads it where CPython has no public way to it.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. From 3.12 class_tag asks the public
 * PyUnstable_Type_AssignVersionTag; on 3.10 and 3.11 it reads tp_version_tag
 * and Py_TPFLAGS_VALID_VERSION_TAG (type_version), gated by VERSION_TAGS
 * (_core.h: 3.10, 3.11, GIL builds); elsewhere there is no tag and a plan
 * lasts one call. tags_check, run on import, checks that tags behave as the
 * class memo relies on, either way; it failing, or the path off, every plan
 * lasts one call. What it buys over the portable core
 * (benchmarks/fast_paths.py): on 3.11.7 up to 53x
 * (attrs batch of 4, flatten_up_to), 48x on a dataclass batch, 9.5x on a
 * state_dict of 10 (benchmarks/results/python3.11/fast_paths.md).
 *   class_tag, meta_tag  a class's tag, its metaclass's
 *   tags_check           the import-time check
 *   plans_kept           whether plans are kept across calls
 * Callers: _class_plans.c's class_entry.
 * Calls: only the C API.
 */

#include "_core.h"

#if VERSION_TAGS
/* A class's version tag, or 0 when it has no valid one, on 3.10 and 3.11,
 * which give no public way to it (from 3.12 _class_plans.c asks
 * PyUnstable_Type_AssignVersionTag): CPython marks a valid tag with
 * Py_TPFLAGS_VALID_VERSION_TAG, and a lookup of the class's attributes gives
 * it one (its method cache). _class_plans.c's tags_check checks, on import,
 * that tags behave as the class memo relies on. */
static inline unsigned int
type_version(PyTypeObject *t)
{
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0;
    }
    return t->tp_version_tag;
}
#endif


/* set on import by tags_check */
PK_DATA int tags_ok;

/* t's version tag, or 0 when it has none that the class memo may key on.
 * assign: give t one if it has none (3.12 on; on 3.10 and 3.11 a lookup of
 * the class's attributes gives it one, as class_plan's do). */
PK_SHARED_INLINE unsigned int
class_tag(PyTypeObject *t, int assign)
{
    if (!tags_ok) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    /* 0 is never a valid tag; PyType_Modified sets it to 0. Where the GIL
     * can be off another thread may set it while it is read: read
     * atomically there, as CPython reads it */
#ifdef Py_GIL_DISABLED
#define TAG_NOW(t) __atomic_load_n(&(t)->tp_version_tag, __ATOMIC_RELAXED)
#else
#define TAG_NOW(t) ((t)->tp_version_tag)
#endif
    if (TAG_NOW(t) == 0 && (!assign || !PyUnstable_Type_AssignVersionTag(t))) {
        return 0;
    }
    return TAG_NOW(t);
#undef TAG_NOW
#elif VERSION_TAGS
    (void)assign;
    return type_version(t);
#else
    (void)t;
    (void)assign;
    return 0;
#endif
}

/* The tag of t's metaclass: 1 for type itself, which no one modifies. */
PK_SHARED_INLINE unsigned int
meta_tag(PyTypeObject *t, int assign)
{
    PyTypeObject *meta = Py_TYPE(t);
    return meta == &PyType_Type ? 1 : class_tag(meta, assign);
}

/* Sets tags_ok when version tags behave as the class memo relies on: a class
 * given a tag keeps it while unchanged; setting an attribute on a class
 * changes its tag and its subclass's (to 0, or to a new one once given one
 * again), and leaves its base's alone; no tag is given twice. A failure of
 * any kind leaves it off (every plan then lasts one call). */
PK_SHARED void
tags_check(void)
{
    PyObject *base = NULL, *sub = NULL, *bases = NULL, *name = NULL, *one = NULL;
    int ok = 0;
    tags_ok = 1;
#if PY_VERSION_HEX < 0x030C0000 && !VERSION_TAGS
    goto done; /* no public way to a tag before 3.12 */
#endif
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
    /* a lookup gives a class a tag on 3.10 and 3.11 (CPython's method cache) */
    PyObject *v = PyObject_GetAttr(sub, name);
    Py_XDECREF(v);
    PyErr_Clear();
    unsigned int b0 = class_tag(b, 1), t0 = class_tag(t, 1);
    if (b0 == 0 || t0 == 0 || b0 == t0 || class_tag(t, 1) != t0 ||
        PyObject_SetAttr(base, name, one) < 0 || class_tag(b, 0) == b0 ||
        class_tag(t, 0) == t0) {
        goto done;
    }
    v = PyObject_GetAttr(sub, name);
    Py_XDECREF(v);
    unsigned int b1 = class_tag(b, 1), t1 = class_tag(t, 1);
    if (b1 == 0 || t1 == 0 || b1 == t1 || b1 == b0 || b1 == t0 || t1 == b0 || t1 == t0 ||
        PyObject_SetAttr(sub, name, one) < 0) {
        goto done;
    }
    v = PyObject_GetAttr(sub, name);
    Py_XDECREF(v);
    ok = class_tag(b, 1) == b1 && class_tag(t, 1) != t1 && class_tag(t, 1) != 0;
done:
    PyErr_Clear();
    tags_ok = ok;
    Py_XDECREF(one);
    Py_XDECREF(name);
    Py_XDECREF(sub);
    Py_XDECREF(bases);
    Py_XDECREF(base);
}

/* Whether plans are kept across calls (for engine_info and the tests). */
PK_SHARED int
plans_kept(void)
{
    return tags_ok;
}
